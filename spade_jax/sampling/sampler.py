"""Batched KV-cache generation with per-token log-probs.

`generate` is the host entry point: it pads prompts (left) and the batch to a
small set of bucket sizes, so a whole run compiles a bounded number of
programs, then runs one jitted prefill + `lax.while_loop` decode.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.models import ModelConfig, forward, init_cache


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Sampling rule. temperature 0 means greedy.

  Attributes:
    temperature: softmax temperature; 0 selects the arg-max.
    top_p: nucleus mass kept (1.0 disables).
    top_k: number of highest logits kept (0 disables).
    eos_id: id that ends a row.
    pad_id: id written after a row ended.
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  eos_id: int = 1
  pad_id: int = 0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature} must be >= 0.")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1].")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it).")


@dataclasses.dataclass
class Generation:
  """Per-row generated ids (EOS included when produced) and their log-probs."""

  tokens: list[list[int]]
  logprobs: list[list[float]]
  finished: list[bool]


def sample_logits(logits: jax.Array, key: jax.Array, rule: SamplingConfig) -> jax.Array:
  """Draws one id per row. logits: [B, V] float32 -> [B] int32."""
  if rule.temperature == 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / rule.temperature
  if rule.top_k:
    kth = jax.lax.top_k(logits, rule.top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if rule.top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    cum = jnp.cumsum(probs, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (always the first id).
    keep = (cum - probs) < rule.top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "rule", "max_new"))
def _generate(params, prompt, valid, key, *, cfg: ModelConfig,
              rule: SamplingConfig, max_new: int):
  """prompt, valid: [B, P] (left padded) -> tokens [B, N], logprobs [B, N], done [B]."""
  B, P = prompt.shape
  S = P + max_new
  lengths = valid.sum(axis=1).astype(jnp.int32)
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)
  kv_valid = jnp.zeros((B, S), bool).at[:, :P].set(valid)
  causal = jnp.arange(S)[None, :] <= jnp.arange(P)[:, None]
  mask = causal[None] & kv_valid[:, None, :]
  cache = init_cache(cfg, B, S)
  logits, cache = forward(params, cfg, prompt, positions, mask, cache, 0)

  def cond(state):
    step, _, _, _, _, _, done, _ = state
    return (step < max_new) & ~jnp.all(done)

  def body(state):
    step, cache, kv_valid, last, toks, logps, done, key = state
    key, sub = jax.random.split(key)
    tok = sample_logits(last, sub, rule)
    logp = jnp.take_along_axis(jax.nn.log_softmax(last, axis=-1), tok[:, None], 1)[:, 0]
    tok = jnp.where(done, rule.pad_id, tok)
    logp = jnp.where(done, 0.0, logp)
    toks = toks.at[:, step].set(tok)
    logps = logps.at[:, step].set(logp)
    done = done | (tok == rule.eos_id)
    idx = P + step
    kv_valid = kv_valid.at[:, idx].set(True)
    logits, cache = forward(params, cfg, tok[:, None], (lengths + step)[:, None],
                            kv_valid[:, None, :], cache, idx)
    return step + 1, cache, kv_valid, logits[:, 0], toks, logps, done, key

  state = (jnp.int32(0), cache, kv_valid, logits[:, -1],
           jnp.full((B, max_new), rule.pad_id, jnp.int32),
           jnp.zeros((B, max_new), jnp.float32), jnp.zeros((B,), bool), key)
  _, _, _, _, toks, logps, done, _ = jax.lax.while_loop(cond, body, state)
  return toks, logps, done


def bucket(n: int, minimum: int = 16) -> int:
  """Smallest power of two >= max(n, minimum)."""
  return max(minimum, 1 << max(0, int(n) - 1).bit_length())


_seen_shapes: set[tuple] = set()


def generate(params, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
             rule: SamplingConfig, key: jax.Array, max_new_tokens: int,
             max_prompt_len: int | None = None) -> Generation:
  """Generates continuations of `prompts` (lists of ids).

  Prompts longer than `max_prompt_len` keep their last `max_prompt_len` ids.
  """
  if not prompts:
    return Generation([], [], [])
  if any(len(p) == 0 for p in prompts):
    raise ValueError("Every prompt needs at least one token; got an empty prompt.")
  prompts = [list(p)[-max_prompt_len:] if max_prompt_len else list(p) for p in prompts]
  B = bucket(len(prompts), 1)
  P = bucket(max(len(p) for p in prompts))
  N = bucket(max_new_tokens)
  arr = np.full((B, P), rule.pad_id, np.int32)
  valid = np.zeros((B, P), bool)
  for i in range(B):
    p = prompts[i] if i < len(prompts) else prompts[0][-1:]
    arr[i, P - len(p):] = p
    valid[i, P - len(p):] = True
  shape = (B, P, N, cfg, rule)
  if shape not in _seen_shapes:
    _seen_shapes.add(shape)
    logging.info("sampler: compiling batch=%d prompt=%d new=%d (%d programs so far)",
                 B, P, N, len(_seen_shapes))
  toks, logps, done = jax.device_get(_generate(
      params, jnp.asarray(arr), jnp.asarray(valid), key, cfg=cfg, rule=rule, max_new=N))
  out_t, out_l, fin = [], [], []
  for i in range(len(prompts)):
    row = toks[i, :max_new_tokens].tolist()
    n = row.index(rule.eos_id) + 1 if rule.eos_id in row else len(row)
    out_t.append(row[:n])
    out_l.append(logps[i, :n].tolist())
    fin.append(rule.eos_id in row)
  return Generation(out_t, out_l, fin)


def num_compiled_programs() -> int:
  """Distinct (batch, prompt, generation) shapes compiled in this process."""
  return len(_seen_shapes)
