"""Chunked log-probs: equal to full logits (values and gradients), and memory."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import get_preset, init_params, logits_from_hidden, token_logprobs
from spade_jax.rl import chunked_head_logprobs, chunked_token_logprobs

B, T = 2, 64


def _inputs(vocab, seed=1):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, vocab, (B, T)), jnp.int32)
  seg = np.ones((B, T), np.int32)
  seg[:, 40:] = 2   # two packed sequences per row
  seg[1, 60:] = 0   # padding
  pos = np.concatenate([np.arange(40), np.arange(T - 40)])[None].repeat(B, 0)
  return tokens, jnp.asarray(pos), jnp.asarray(seg)


@pytest.mark.parametrize("tie,chunk", [
    (True, 24),  # 24 does not divide T: padded tail
    pytest.param(False, 16, marks=pytest.mark.slow),
])
def test_chunked_equals_full_with_gradients(tie, chunk):
  cfg = get_preset("tiny", vocab_size=1024, tie_embeddings=tie)
  params = init_params(jax.random.key(0), cfg)
  tokens, pos, seg = _inputs(cfg.vocab_size)
  w = jax.random.normal(jax.random.key(2), (B, T))

  @functools.partial(jax.jit, static_argnums=1)
  def value_and_grad(p, chunk_size):
    f = lambda p: jnp.sum(w * chunked_token_logprobs(p, cfg, tokens, pos, seg,
                                                     chunk_size))
    return chunked_token_logprobs(p, cfg, tokens, pos, seg, chunk_size), jax.grad(f)(p)

  want = token_logprobs(params, cfg, tokens, pos, seg)
  _, g_full = value_and_grad(params, None)
  got, g_chunk = value_and_grad(params, chunk)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert np.all(np.asarray(got)[seg == 0] == 0.0)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_chunk),
                          jax.tree.leaves(g_full)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("tie", [True, False])
def test_chunked_head_backward_never_holds_full_logits(tie):
  # The head alone (hidden -> log-probs), with V large enough that one
  # [B, T, V] float32 buffer dominates everything else.
  cfg = get_preset("tiny", vocab_size=32768, tie_embeddings=tie)
  head = {k: v for k, v in init_params(jax.random.key(0), cfg).items()
          if k in ("embed", "lm_head")}
  t, v = 512, cfg.vocab_size
  hidden = jnp.zeros((B, t, cfg.d_model))
  targets = jnp.zeros((B, t), jnp.int32)
  full_bytes = B * t * v * 4

  def full(head, h):
    logits = logits_from_hidden(head, cfg, h)
    return jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

  def chunked(head, h):
    return jnp.sum(chunked_head_logprobs(head, cfg, h, targets, 32))

  def compiled(f):
    return jax.jit(jax.grad(f, argnums=(0, 1))).lower(head, hidden).compile()

  full_temp = compiled(full).memory_analysis().temp_size_in_bytes
  c = compiled(chunked)
  chunk_temp = c.memory_analysis().temp_size_in_bytes
  assert full_temp >= full_bytes  # the unchunked head does materialise it
  assert chunk_temp < full_bytes / 4, (chunk_temp, full_bytes)
  text = c.as_text()
  for shape in (f"f32[{B},{t},{v}]", f"f32[{B * t},{v}]", f"f32[{v},{B},{t}]"):
    assert shape not in text, shape


def test_model_path_has_no_full_logits_buffer():
  cfg = get_preset("tiny", vocab_size=32768)
  params = init_params(jax.random.key(0), cfg)
  tokens, pos, seg = _inputs(cfg.vocab_size)
  f = lambda p: jnp.sum(chunked_token_logprobs(p, cfg, tokens, pos, seg, 16))
  text = jax.jit(jax.grad(f)).lower(params).compile().as_text()
  v = cfg.vocab_size
  for shape in (f"f32[{B},{T},{v}]", f"f32[{B},{T - 1},{v}]", f"f32[{B * T},{v}]"):
    assert shape not in text, shape
  assert f"f32[{B},16,{v}]" in text  # one chunk at a time


def test_bad_chunk_raises():
  cfg = get_preset("tiny")
  with pytest.raises(ValueError, match="chunk_size=-1"):
    chunked_head_logprobs({"embed": jnp.zeros((cfg.vocab_size, cfg.d_model))}, cfg,
                          jnp.zeros((1, 4, cfg.d_model)), jnp.zeros((1, 4), jnp.int32), -1)
