"""Optimizer construction from a frozen config."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import optax

from spade_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with global-norm clipping (reference: lr 1e-6, wd 0.1, betas 0.9/0.98).

  Attributes:
    name: "adamw" (default), "adam" (no weight decay) or "sgd" (plain
      gradient descent, e.g. for exactness checks and baselines).
    learning_rate: peak learning rate.
    schedule: "constant" | "cosine" | "linear_warmup".
    warmup_steps: linear warm-up steps (schedules other than constant).
    total_steps: steps for cosine decay.
    b1, b2, eps: Adam moments.
    weight_decay: decoupled weight decay (applied to matrices only, not to
      norm scales).
    grad_clip: global-norm clip; 0 disables.
  """

  name: str = "adamw"
  learning_rate: float = 1e-6
  schedule: str = "constant"
  warmup_steps: int = 0
  total_steps: int = 1000
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-8
  weight_decay: float = 0.1
  grad_clip: float = 1.0

  def __post_init__(self):
    OPTIMIZERS.check(self.name)
    SCHEDULES.check(self.schedule)


SCHEDULES: Registry[Callable[[OptimizerConfig], optax.Schedule]] = Registry(
    "learning-rate schedule", {
        "constant": lambda c: optax.constant_schedule(c.learning_rate),
        "linear_warmup": lambda c: optax.linear_schedule(0.0, c.learning_rate,
                                                          max(1, c.warmup_steps)),
        "cosine": lambda c: optax.warmup_cosine_decay_schedule(
            0.0, c.learning_rate, max(1, c.warmup_steps), max(2, c.total_steps)),
    }, field="optimizer.schedule")


def decay_mask(params):
  """True for parameters that get weight decay (ndim >= 2 after the layer axis)."""
  def leaf(path, x):
    name = jax.tree_util.keystr(path)
    return "norm" not in name
  return jax.tree_util.tree_map_with_path(leaf, params)


OPTIMIZERS: Registry[Callable[[OptimizerConfig, optax.Schedule],
                              optax.GradientTransformation]] = Registry(
    "optimizer", {
        "adamw": lambda c, lr: optax.adamw(lr, b1=c.b1, b2=c.b2, eps=c.eps,
                                           weight_decay=c.weight_decay, mask=decay_mask),
        "adam": lambda c, lr: optax.adam(lr, b1=c.b1, b2=c.b2, eps=c.eps),
        "sgd": lambda c, lr: optax.sgd(lr),
    }, field="optimizer.name")


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """Gradient clipping (when set) followed by the named optimizer."""
  parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip else []
  parts.append(OPTIMIZERS[cfg.name](cfg, SCHEDULES[cfg.schedule](cfg)))
  return optax.chain(*parts)
