"""Optimizer construction from a frozen config."""

from __future__ import annotations

import dataclasses

import jax
import optax


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


def _schedule(cfg: OptimizerConfig):
  if cfg.schedule == "constant":
    return optax.constant_schedule(cfg.learning_rate)
  if cfg.schedule == "linear_warmup":
    return optax.linear_schedule(0.0, cfg.learning_rate, max(1, cfg.warmup_steps))
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, max(1, cfg.warmup_steps), max(2, cfg.total_steps))
  raise ValueError(f"Unknown schedule {cfg.schedule!r}; valid: "
                   "['constant', 'cosine', 'linear_warmup'].")


def decay_mask(params):
  """True for parameters that get weight decay (ndim >= 2 after the layer axis)."""
  def leaf(path, x):
    name = jax.tree_util.keystr(path)
    return "norm" not in name
  return jax.tree_util.tree_map_with_path(leaf, params)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """Gradient clipping followed by AdamW."""
  parts = []
  if cfg.grad_clip:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip))
  lr = _schedule(cfg)
  if cfg.name == "adamw":
    parts.append(optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, mask=decay_mask))
  elif cfg.name == "adam":
    parts.append(optax.adam(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
  elif cfg.name == "sgd":
    parts.append(optax.sgd(lr))
  else:
    raise ValueError(f"Unknown optimizer {cfg.name!r}; valid: ['adam', 'adamw', 'sgd'].")
  return optax.chain(*parts)
