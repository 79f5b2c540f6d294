"""Batched generation with per-token log-probs, on top of `Engine`.

`generate` is the one-shot entry point: prompts (left padded) and the batch
round up to a small set of bucket sizes, so a whole run compiles a bounded
number of programs. `Sampler` binds parameters, model config, rule and a key
schedule into a policy that both answers one-shot calls and opens multi-turn
engines (see `spade_jax.selfplay.episodes`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from spade_jax.models import ModelConfig
from spade_jax.sampling.engine import Engine, bucket, num_engine_programs
from spade_jax.sampling.rules import SamplingConfig, row_keys

__all__ = ["Generation", "Sampler", "bucket", "generate", "num_compiled_programs"]


@dataclasses.dataclass
class Generation:
  """Per-row generated ids (stop id included when produced) and their log-probs."""

  tokens: list[list[int]]
  logprobs: list[list[float]]
  finished: list[bool]


def generate(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
             rule: SamplingConfig, key: jax.Array, max_new_tokens: int,
             max_prompt_len: int | None = None, *,
             detokenize: Callable[[Sequence[int]], str] | None = None,
             cache_dtype: str | None = None, mesh=None, rules=None) -> Generation:
  """Generates continuations of `prompts` (lists of ids).

  Row i draws with key `fold_in(key, i)` at each of its positions, so its
  output does not depend on the other rows.

  Args:
    params: model parameters.
    cfg: model config.
    prompts: B lists of ids, each non-empty. Prompts longer than
      `max_prompt_len` keep their last `max_prompt_len` ids.
    rule: sampling rule.
    key: PRNG key.
    max_new_tokens: tokens per row at most.
    detokenize: ids -> text; needed when `rule.stop` is set.
    cache_dtype: KV cache dtype (default: the model's compute dtype).
    mesh, rules: optional mesh and rule set to shard the batch and kv heads.

  Returns:
    A `Generation` with B rows.
  """
  if not prompts:
    return Generation([], [], [])
  if any(len(p) == 0 for p in prompts):
    raise ValueError("Every prompt needs at least one token; got an empty prompt.")
  prompts = [list(p)[-max_prompt_len:] if max_prompt_len else list(p) for p in prompts]
  P = bucket(max(len(p) for p in prompts))
  N = bucket(max_new_tokens)
  eng = Engine(cfg, params, slots=bucket(len(prompts), 1), max_len=P + N, rule=rule,
               mesh=mesh, rules=rules, cache_dtype=cache_dtype, detokenize=detokenize)
  keys = np.asarray(jax.random.key_data(row_keys(key, len(prompts))))  # one transfer
  eng.extend(dict(enumerate(prompts)), dict(enumerate(keys)))
  out = eng.decode({i: max_new_tokens for i in range(len(prompts))})
  rows = [out[i] for i in range(len(prompts))]
  return Generation([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def num_compiled_programs() -> int:
  """Distinct sampler programs (shape x config) compiled in this process."""
  return num_engine_programs()


class Sampler:
  """A policy: current parameters, rule and key schedule.

  Calling it generates one-shot continuations; `engine` opens a multi-turn
  engine on the same parameters. `set_params` hands over new parameters
  after a train step (no copy through the host).

  Args:
    params: model parameters.
    cfg: model config.
    rule: sampling rule.
    key: base key; call n uses `fold_in(key, n)`.
    detokenize: ids -> text, for stop strings.
    cache_dtype: KV cache dtype (default: the model's compute dtype).
    mesh, rules: optional mesh and rule set for the inference layout.
  """

  def __init__(self, params, cfg: ModelConfig, rule: SamplingConfig, key: jax.Array, *,
               detokenize=None, cache_dtype: str | None = None, mesh=None, rules=None):
    self.params, self.cfg, self.rule, self.key = params, cfg, rule, key
    self.detokenize, self.cache_dtype = detokenize, cache_dtype
    self.mesh, self.rules = mesh, rules
    self.calls = 0

  def next_key(self) -> jax.Array:
    """A fresh key for the next call."""
    k = jax.random.fold_in(self.key, self.calls)
    self.calls += 1
    return k

  def set_params(self, params) -> None:
    self.params = params

  def __call__(self, prompts: list[list[int]], max_new: int) -> Generation:
    return generate(self.params, self.cfg, prompts, self.rule, self.next_key(), max_new,
                    detokenize=self.detokenize, cache_dtype=self.cache_dtype,
                    mesh=self.mesh, rules=self.rules)

  def engine(self, slots: int, max_len: int, **kwargs) -> Engine:
    """A fresh multi-turn engine on the current parameters."""
    return Engine(self.cfg, self.params, slots=slots, max_len=max_len, rule=self.rule,
                  mesh=self.mesh, rules=self.rules, cache_dtype=self.cache_dtype,
                  detokenize=self.detokenize, **kwargs)

