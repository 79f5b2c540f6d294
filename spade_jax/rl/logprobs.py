"""Token log-probabilities without materialising [B, T, V] logits.

The decoder runs once to its final hidden states [B, T, D]; the output
projection, log-softmax and target gather then run over sequence chunks of
`chunk_size` positions inside a `lax.scan`. Each chunk is rematerialised
(`jax.checkpoint`), so the backward pass recomputes one [B, C, V] logits block
at a time as well: peak logits memory is B * C * V floats instead of
B * T * V (for Qwen3's 151,936-token vocabulary, 8,192 tokens and C = 512
that is 0.3 GB per sequence instead of 5 GB).

The head follows `spade_jax.models.logits_from_hidden` exactly (tied or untied
`lm_head`, float32 logits), and the result equals
`spade_jax.models.token_logprobs`.

The policy trained is the one that sampled (docs/METHOD.md §1.8): with a
`temperature` array the log-probs are of `log_softmax(logits / T)`, T per
token (the temperature of the role that sampled the row), the same arithmetic
as the sampler's recorded log-probs (`sampling.rules.token_logprob` of the
tempered logits). Top-k / top-p truncation is not modelled here: truncated
importance sampling absorbs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spade_jax.models import (ModelConfig, forward, logits_from_hidden,
                              segment_mask)
from spade_jax.models import token_logprobs as _full_token_logprobs

_HEAD_KEYS = ("embed", "lm_head")


def _head_params(params):
  """The parameters `logits_from_hidden` reads (embedding and/or lm_head)."""
  return {k: params[k] for k in _HEAD_KEYS if k in params}


def chunked_head_logprobs(head_params, cfg: ModelConfig, hidden: jax.Array,
                          targets: jax.Array, chunk_size: int,
                          temperature: jax.Array | None = None) -> jax.Array:
  """log softmax(hidden @ W / T)[target], one sequence chunk at a time.

  Args:
    head_params: {"embed": [V, D]} (tied) and/or {"lm_head": [V, D]}.
    cfg: model config (tying, compute dtype).
    hidden: [B, T, D] final hidden states.
    targets: [B, T] int token id whose log-probability is read at each
      position.
    chunk_size: positions per chunk C; T is padded up to a multiple of C.
    temperature: [B, T] float32 softmax temperature per position (> 0), or
      None for the untempered model.

  Returns:
    [B, T] float32 log-probabilities.
  """
  if chunk_size <= 0:
    raise ValueError(f"chunk_size={chunk_size}; expected a positive number of "
                     "positions per chunk (or use the unchunked path).")
  B, T, D = hidden.shape
  C = min(chunk_size, T)
  n = -(-T // C)
  pad = n * C - T
  temp = (jnp.ones((B, T), jnp.float32) if temperature is None
          else temperature.astype(jnp.float32))
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    temp = jnp.pad(temp, ((0, 0), (0, pad)), constant_values=1.0)
  # [n, B, C, ...]: the scan runs over chunks of the sequence.
  h = hidden.reshape(B, n, C, D).swapaxes(0, 1)
  y = targets.reshape(B, n, C).swapaxes(0, 1)
  t = temp.reshape(B, n, C).swapaxes(0, 1)

  @jax.checkpoint
  def chunk(h_c, y_c, t_c):
    logits = logits_from_hidden(head_params, cfg, h_c)  # [B, C, V] float32
    if temperature is not None:
      logits = logits / t_c[..., None]
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, y_c[..., None], axis=-1)[..., 0]
    return tgt - lse

  def body(carry, xs):
    return carry, chunk(*xs)

  _, out = jax.lax.scan(body, None, (h, y, t))  # [n, B, C]
  return out.swapaxes(0, 1).reshape(B, n * C)[:, :T]


def chunked_token_logprobs(params, cfg: ModelConfig, tokens: jax.Array,
                           positions: jax.Array, segment_ids: jax.Array,
                           chunk_size: int | None = 512, *,
                           temperature: jax.Array | None = None,
                           prefix_ids: jax.Array | None = None,
                           return_moe_dropped: bool = False):
  """Log-probability of each token given its prefix within its segment.

  Args:
    params: model parameters.
    cfg: model config; `cfg.remat` sets the decoder's rematerialisation.
    tokens, positions, segment_ids: [B, T]; segment id 0 marks padding.
    chunk_size: positions per logits chunk; None or 0 computes the full
      [B, T, V] logits (`spade_jax.models.token_logprobs`).
    temperature: [B, T] softmax temperature of each token's row (the
      temperature the row was sampled at; position t's entry tempers the
      distribution that predicts token t), or None for the untempered model.
    return_moe_dropped: also return the (token, expert) copies the MoE
      capacity factor dropped (see `forward`).

  Returns:
    [B, T] float32; entry t is log p(tokens[t] | tokens[<t]) within the same
    segment, and 0 at t = 0, at segment starts, on padding and on shared
    prefixes (negative segment ids). With
    `return_moe_dropped`, (that, the int32 dropped count).
  """
  if not chunk_size and not return_moe_dropped and temperature is None:
    return _full_token_logprobs(params, cfg, tokens, positions, segment_ids, prefix_ids)
  hidden, _, dropped = forward(params, cfg, tokens, positions,
                               segment_mask(segment_ids, prefix_ids),
                               return_hidden=True, return_moe_dropped=True)
  # Position t predicts token t + 1 (the last position's target is a dummy).
  targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  # Position t predicts token t + 1 at token t + 1's temperature.
  temp = (None if temperature is None else
          jnp.pad(temperature[:, 1:], ((0, 0), (0, 1)), constant_values=1.0))
  if chunk_size:
    nxt = chunked_head_logprobs(_head_params(params), cfg, hidden, targets, chunk_size,
                                temp)
  else:
    logits = logits_from_hidden(params, cfg, hidden)
    if temp is not None:
      logits = logits / temp[..., None].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nxt = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  nxt = nxt[:, :-1]
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
  nxt = jnp.where(same, nxt, 0.0)
  logps = jnp.concatenate([jnp.zeros_like(nxt[:, :1]), nxt], axis=1)
  return (logps, dropped) if return_moe_dropped else logps
