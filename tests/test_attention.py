"""Attention kernels chosen by name in ModelConfig: equal results, loud bad names."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import attention
from spade_jax.models import (ATTENTION, DECODE_ATTENTION, ModelConfig, decode_params,
                              decode_step, forward, get_preset, init_cache, init_params,
                              load_model_config, segment_mask)

CFG = get_preset("tiny")
B = 2


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _prefill(params, cfg, toks, S):
  """Logits [B, P, V] of a prefill into a fresh S-entry cache, and the cache."""
  P = toks.shape[1]
  pos = jnp.tile(jnp.arange(P), (B, 1))
  mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(P)[:, None], (B, P, S))
  return jax.jit(lambda p, c: forward(p, cfg, toks, pos, mask, c, 0))(
      params, init_cache(cfg, B, S, "float32"))


@pytest.mark.parametrize("name", list(ATTENTION))
def test_every_attention_kernel_matches_default(params, name):
  cfg = dataclasses.replace(CFG, attention=name)
  toks = jax.random.randint(jax.random.key(1), (B, 24), 3, CFG.vocab_size)
  pos = jnp.tile(jnp.arange(24), (B, 1))
  mask = segment_mask(jnp.ones_like(toks))
  want, _ = forward(params, CFG, toks, pos, mask)
  got, _ = forward(params, cfg, toks, pos, mask)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # With a cache (prefill / extend path).
  want, _ = _prefill(params, CFG, toks, 32)
  got, _ = _prefill(params, cfg, toks, 32)
  np.testing.assert_allclose(got, want, atol=1e-5)


# 512 entries: on CPU "auto" reads the cache whole, "blocks" walks two blocks.
@pytest.mark.parametrize("name", list(DECODE_ATTENTION))
def test_every_decode_attention_kernel_matches_default(params, name):
  cfg = dataclasses.replace(CFG, decode_attention=name)
  S, P, steps = 512, 300, 3
  toks = jax.random.randint(jax.random.key(2), (B, P + steps), 3, CFG.vocab_size)
  _, cache = _prefill(params, CFG, toks[:, :P], S)
  dp = decode_params(params, CFG)

  def run(c, feature_major):
    """Logits [steps, B, V] of `steps` decode steps under config c."""

    @jax.jit
    def step(kv, t):
      valid = jnp.broadcast_to(jnp.arange(S) <= t, (B, S))
      tok, pos = jax.lax.dynamic_index_in_dim(toks, t, 1, False), jnp.full((B,), t)
      if feature_major:
        return decode_step(dp, c, tok, pos, valid, kv, t, t + 1)
      logits, kv = forward(params, c, tok[:, None], pos[:, None], valid[:, None], kv, t,
                           live_len=t + 1)
      return logits[:, 0], kv

    kv, out = cache, []
    for t in range(P, P + steps):
      logits, kv = step(kv, jnp.int32(t))
      out.append(logits)
    return jnp.stack(out)

  for feature_major in (False, True):
    np.testing.assert_allclose(run(cfg, feature_major), run(CFG, feature_major), atol=1e-5)


def test_unknown_kernel_names_fail_at_config_construction():
  with pytest.raises(ValueError, match=r"Unknown attention implementation 'flash'; "
                     r"expected one of \['auto', 'blocked', 'einsum', 'matmul'\]\. "
                     r"Set model\.attention"):
    ModelConfig(attention="flash")
  with pytest.raises(ValueError, match=r"Unknown decode attention implementation 'paged'; "
                     r"expected one of \['auto', 'blocks', 'dot', 'whole'\]"):
    dataclasses.replace(CFG, decode_attention="paged")
  with pytest.raises(ValueError, match=r"Unknown remat policy 'some'"):
    ModelConfig(remat="some")


def test_model_config_json_without_kernel_fields_loads(tmp_path):
  values = dataclasses.asdict(dataclasses.replace(CFG, decode_attention="blocks"))
  (tmp_path / "model_config.json").write_text(json.dumps(values))
  assert load_model_config(str(tmp_path))[0].decode_attention == "blocks"
  for key in ("attention", "decode_attention"):
    values.pop(key)
  (tmp_path / "model_config.json").write_text(json.dumps(values))
  cfg, _ = load_model_config(str(tmp_path))
  assert (cfg.attention, cfg.decode_attention) == ("auto", "auto")


def _packed_case(B=4, T=80, S=None, H=4, K=2, E=8, seed=0):
  """Random q, k, v and a packed causal mask (segments, padding, one empty row)."""
  S = S or T
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, T, H, E)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, K, E, S)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, K, S, E)), jnp.float32)
  seg = np.zeros((max(B, 4), T), np.int32)
  seg[0] = 1
  seg[1, :20], seg[1, 20:53], seg[1, 53:70] = 1, 2, 3
  seg[2, :37] = 5  # the rest padding; row 3 is all padding
  return q, k, v, seg[:B]


def test_even_block_cuts_a_side_into_equal_blocks_with_little_padding():
  assert attention.even_block(200, 256) == 200  # one block
  assert attention.even_block(512, 256) == 256
  assert attention.even_block(576, 256) == 192  # 3 x 192, not 768 = 3 x 256
  assert attention.even_block(640, 256) == 216  # 3 x 216 = 648
  assert attention.even_block(80, 48) == 40
  for n in range(1, 700, 7):
    for most in (16, 32, 256):
      b = attention.even_block(n, most)
      assert b <= max(most, 1) and -(-n // b) == -(-n // most), (n, most, b)


# 48 cuts the 80 queries into two blocks of 40 (no padding).
@pytest.mark.parametrize("block", [16, 32, 48, 256])
def test_blocked_attention_matches_matmul_forward_and_gradients(block):
  q, k, v, seg = _packed_case()
  mask = segment_mask(jnp.asarray(seg))
  seen = jnp.asarray(seg > 0)[:, :, None, None]
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32) * seen

  def blocked(q, k, v, m):
    return attention.blocked_attention(q, k, v, m, block=block)

  want = attention.matmul_attention(q, k, v, mask)
  got = jax.jit(blocked)(q, k, v, mask)
  np.testing.assert_allclose(got * seen, want * seen, atol=2e-6)
  # A query that sees no key (padding) gives 0.
  np.testing.assert_array_equal(got[3], 0.0)

  def loss(fn):
    return lambda q, k, v: (fn(q, k, v, mask) * w).sum()

  want_g = jax.grad(loss(attention.matmul_attention), argnums=(0, 1, 2))(q, k, v)
  got_g = jax.jit(jax.grad(loss(blocked), argnums=(0, 1, 2)))(q, k, v)
  for g, h in zip(got_g, want_g):
    np.testing.assert_allclose(g, h, atol=1e-5)


def test_blocked_attention_skips_blocks_and_handles_long_caches():
  # An extend: 40 queries at positions 100-139 of a 200-entry cache; keys past
  # each query are masked, so the last key blocks are never visited.
  q, k, v, _ = _packed_case(B=2, T=40, S=200, seed=3)
  mask = jnp.broadcast_to(jnp.arange(200)[None, :] <= 100 + jnp.arange(40)[:, None],
                          (2, 40, 200))
  want = attention.matmul_attention(q, k, v, mask)
  for block in (16, 64):
    got = attention.blocked_attention(q, k, v, mask, block=block)
    np.testing.assert_allclose(got, want, atol=2e-6)
  live = attention._live(jnp.pad(mask, ((0, 0), (0, 8), (0, 8))), 16, 16)
  assert not bool(live[:, :, -1].any()) and bool(live[:, -1, 0].all())
  # bfloat16 inputs: bfloat16 out, within bfloat16 rounding of the matmul kernel.
  bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  got = attention.blocked_attention(*bf, mask, block=16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(got.astype(jnp.float32),
                             attention.matmul_attention(*bf, mask).astype(jnp.float32),
                             atol=3e-2)


def test_auto_attention_picks_blocked_for_long_rows_on_cpu(params, monkeypatch):
  monkeypatch.setattr(attention, "ATTENTION_BLOCK", 16)
  calls = []
  real = attention.blocked_attention
  monkeypatch.setattr(attention, "blocked_attention",
                      lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
  toks = jax.random.randint(jax.random.key(4), (B, 40), 3, CFG.vocab_size)
  seg = jnp.asarray(np.repeat([[1] * 25 + [2] * 15], B, axis=0))
  pos = jnp.asarray(np.repeat([list(range(25)) + list(range(15))], B, axis=0))
  mask = segment_mask(seg)
  matmul = dataclasses.replace(CFG, attention="matmul")
  assert CFG.attention == "auto"

  def loss(p, cfg):
    return (forward(p, cfg, toks, pos, mask)[0] ** 2).mean()

  want, want_g = jax.value_and_grad(loss)(params, matmul)
  got, got_g = jax.value_and_grad(loss)(params, CFG)
  assert calls and calls[0][1] == 40
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, h in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(g, h, atol=1e-5 * max(1.0, float(jnp.abs(h).max())))
  # A 16-token chunk (one block) stays on the matmul kernel.
  calls.clear()
  forward(params, CFG, toks[:, :16], pos[:, :16], mask[:, :16, :16])
  assert not calls


def test_blocked_attention_under_a_batch_sharded_mesh():
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  q, k, v, seg = _packed_case(B=len(devices), T=64, seed=5)
  mask = segment_mask(jnp.asarray(seg))
  mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))

  def loss(fn):
    return lambda q, k, v, m: (fn(q, k, v, m) ** 2 * (m.any(-1)[..., None, None])).sum()

  blocked = lambda q, k, v, m: attention.blocked_attention(q, k, v, m, block=16)
  want = jax.grad(loss(attention.matmul_attention), argnums=(0, 1, 2))(q, k, v, mask)
  got = jax.jit(jax.grad(loss(blocked), argnums=(0, 1, 2)))(*map(put, (q, k, v, mask)))
  assert got[0].sharding.spec[0] == "data" or len(devices) == 1
  for g, h in zip(got, want):
    np.testing.assert_allclose(g, h, atol=1e-5)
