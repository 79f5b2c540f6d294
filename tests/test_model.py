"""Model: shapes, axes, KV-cache consistency, segment packing, sharded forward."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import (ByteVocab, ChatTemplate, ModelConfig, decode_params,
                              decode_step, forward, get_preset, init_cache, init_params,
                              param_axes, param_shapes, segment_mask, token_logprobs)
from spade_jax.models import attention

CFG = get_preset("tiny")


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def test_axes_and_shapes_cover_every_param(params):
  is_leaf = lambda x: isinstance(x, tuple)
  axes = jax.tree.leaves(param_axes(CFG), is_leaf=is_leaf)
  shapes = jax.tree.leaves(param_shapes(CFG), is_leaf=is_leaf)
  leaves = jax.tree.leaves(params)
  assert len(axes) == len(shapes) == len(leaves)
  for a, s, x in zip(axes, shapes, leaves):
    assert len(a) == len(s) == x.ndim and tuple(s) == x.shape


def test_untied_head_and_eval_shape():
  cfg = ModelConfig(tie_embeddings=False, num_layers=3)
  shapes = jax.eval_shape(lambda k: init_params(k, cfg), jax.random.key(0))
  assert shapes["lm_head"].shape == (cfg.vocab_size, cfg.d_model)
  assert shapes["layers"]["q"].shape == (3, cfg.d_model, cfg.num_heads, cfg.head_dim)


def test_bad_config_errors():
  with pytest.raises(ValueError, match="num_kv_heads"):
    ModelConfig(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match="Unknown model preset 'nope'; expected one of .*'tiny'"):
    get_preset("nope")


def test_cache_prefill_and_decode_match_full_forward(params):
  T = 12
  toks = jax.random.randint(jax.random.key(1), (2, T), 3, 259)
  pos = jnp.tile(jnp.arange(T), (2, 1))
  full, _ = forward(params, CFG, toks, pos, segment_mask(jnp.ones_like(toks)))
  S = 16
  cache = init_cache(CFG, 2, S)
  P = 7
  m = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(P)[:, None], (2, P, S))
  out, cache = forward(params, CFG, toks[:, :P], pos[:, :P], m, cache, 0)
  np.testing.assert_allclose(out, full[:, :P], atol=1e-5)
  for t in range(P, T):
    m = jnp.broadcast_to(jnp.arange(S) <= t, (2, 1, S))
    out, cache = forward(params, CFG, toks[:, t:t + 1], pos[:, t:t + 1], m, cache, t)
    np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-5)


@pytest.mark.parametrize("preset,per_layer", [("tiny", True), ("tiny", False),
                                               ("tiny_moe", True)])
def test_feature_major_decode_step_matches_forward(preset, per_layer):
  cfg = dataclasses.replace(get_preset(preset), tie_embeddings=preset == "tiny")
  p = init_params(jax.random.key(4), cfg)
  dp = decode_params(p, cfg)
  assert len(dp["layers"]) == cfg.num_layers
  H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  assert dp["layers"][0]["qkv"].shape == ((H + 2 * K) * E, cfg.d_model)
  assert dp["layers"][0]["o"].shape == (cfg.d_model, cfg.num_heads * cfg.head_dim)
  assert len(dp["mlp"]) == cfg.num_dense_layers and len(dp["moe"]) == cfg.num_moe_layers
  if dp["mlp"]:
    assert dp["mlp"][0]["gate_up"].shape == (2 * cfg.mlp_dim, cfg.d_model)
    assert dp["mlp"][0]["down"].shape == (cfg.d_model, cfg.mlp_dim)
  B, P, S = 3, 6, 16
  toks = jax.random.randint(jax.random.key(5), (B, P + 4), 3, 259)
  pos = jnp.tile(jnp.arange(P + 4), (B, 1))
  m = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(P)[:, None], (B, P, S))
  _, cache = forward(p, cfg, toks[:, :P], pos[:, :P], m,
                     init_cache(cfg, B, S, "float32", per_layer=per_layer), 0)
  ref_cache = cache
  step = jax.jit(lambda dp, c, t, ps, v, i: decode_step(dp, cfg, t, ps, v, c, i, i + 1))
  for t in range(P, P + 4):
    valid = jnp.broadcast_to(jnp.arange(S) <= t, (B, S))
    want, ref_cache = forward(p, cfg, toks[:, t:t + 1], pos[:, t:t + 1], valid[:, None],
                              ref_cache, t, live_len=t + 1)
    got, cache = step(dp, cache, toks[:, t], pos[:, t], valid, jnp.int32(t))
    np.testing.assert_allclose(got, want[:, 0], atol=2e-5)
    for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(ref_cache)):
      np.testing.assert_allclose(a, b, atol=2e-5)


def test_packed_segments_equal_separate_rows(params):
  a = jax.random.randint(jax.random.key(2), (1, 9), 3, 259)
  b = jax.random.randint(jax.random.key(3), (1, 6), 3, 259)
  lp_a = token_logprobs(params, CFG, a, jnp.arange(9)[None], jnp.ones_like(a))
  lp_b = token_logprobs(params, CFG, b, jnp.arange(6)[None], jnp.ones_like(b))
  packed = jnp.concatenate([a, b, jnp.zeros((1, 1), a.dtype)], 1)
  pos = jnp.concatenate([jnp.arange(9), jnp.arange(6), jnp.zeros(1, int)])[None]
  seg = jnp.array([[1] * 9 + [2] * 6 + [0]])
  lp = token_logprobs(params, CFG, packed, pos, seg)
  np.testing.assert_allclose(lp[0, :9], lp_a[0], atol=1e-5)
  np.testing.assert_allclose(lp[0, 9:15], lp_b[0], atol=1e-5)
  assert float(lp[0, 9]) == 0.0 and float(lp[0, 15]) == 0.0


@pytest.mark.parametrize("mesh_cfg", [
    parallel.MeshConfig(data=-1, rules="fsdp"),
    parallel.MeshConfig(data=2, fsdp=2, tensor=2, rules="fsdp_tensor"),
    parallel.MeshConfig(data=1, fsdp=-1, rules="fsdp"),
    parallel.MeshConfig(data=1, fsdp=2, tensor=2, expert=2, rules="fsdp_tensor_expert"),
])
def test_sharded_forward_equals_single_device(params, mesh_cfg):
  assert jax.device_count() == 8
  mesh = parallel.make_mesh(mesh_cfg)
  rules = parallel.RULE_SETS[mesh_cfg.rules]
  shard = parallel.tree_shardings(param_axes(CFG), jax.tree.map(lambda x: x.shape, params),
                                  mesh, rules)
  sp = jax.device_put(params, shard)
  toks = jax.random.randint(jax.random.key(4), (8, 16), 3, 259)
  pos = jnp.tile(jnp.arange(16), (8, 1))
  seg = jnp.ones_like(toks)
  ref = token_logprobs(params, CFG, toks, pos, seg)
  toks_s = jax.device_put(toks, parallel.batch_sharding(mesh, rules, 2))
  with parallel.activation_sharding(mesh, rules):
    got = jax.jit(lambda p, t: token_logprobs(p, CFG, t, pos, seg))(sp, toks_s)
  np.testing.assert_allclose(got, ref, atol=1e-5)


def test_mesh_errors():
  with pytest.raises(ValueError, match="needs 6 devices"):
    parallel.make_mesh(parallel.MeshConfig(data=3, fsdp=2))
  with pytest.raises(ValueError, match="Unknown sharding rule set"):
    parallel.MeshConfig(rules="zero3")


def test_byte_vocab_and_chat_round_trip():
  v = ByteVocab()
  assert v.vocab_size == 259 and v.eos_id == 1
  ids = v.encode("héllo \\boxed{4}")
  assert min(ids) >= 3 and v.decode(ids) == "héllo \\boxed{4}"
  chat = ChatTemplate(v)
  p = chat.prompt("sys", "hi")
  assert v.decode(p) == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  with pytest.raises(ValueError, match="Unknown chat role"):
    chat.message("robot", "x")


@pytest.mark.parametrize("S,live,read_whole,dot_scores", [
    (64, 1, True, False), (64, 37, True, False), (192, 130, True, False),  # read whole
    (768, 700, True, False), (192, 130, True, True), (768, 700, True, True),
    (512, 512, False, False), (768, 300, False, False), (2048, 1500, False, False),  # loop
    (768, 300, 0.5, False), (768, 700, 0.5, False), (768, 384, 0.5, True),  # chosen by live
    (2048, 1500, 0.75, False), (192, 30, 0.5, False)])
def test_blocked_decode_attention_equals_full_softmax(S, live, read_whole, dot_scores):
  B = 3
  ks = jax.random.split(jax.random.key(S + live), 4)
  q = jax.random.normal(ks[0], (B, 1, 4, 16))
  k = jax.random.normal(ks[1], (B, 2, 16, S))  # keys [B, K, E, S]
  v = jax.random.normal(ks[2], (B, 2, S, 16))
  # Holes inside the live prefix (released / padding entries); nothing at or after `live`.
  mask = (jax.random.uniform(ks[3], (B, 1, S)) < 0.8) & (jnp.arange(S) < live)
  mask = mask.at[:, :, 0].set(True)
  want = attention.matmul_attention(q, k, v, mask)
  kernel = functools.partial(attention.decode_attention, read_whole=read_whole,
                             dot_scores=dot_scores)
  got = jax.jit(kernel)(q, k, v, mask, jnp.int32(live))
  np.testing.assert_allclose(got, want, atol=2e-5)
  blk = attention.live_block(S)
  assert blk <= attention.DECODE_BLOCK and S % blk == 0


def test_decode_attention_live_share_rejects_a_share_outside_0_1():
  q, k, v = jnp.zeros((1, 1, 2, 4)), jnp.zeros((1, 1, 4, 512)), jnp.zeros((1, 1, 512, 4))
  mask = jnp.ones((1, 1, 512), bool)
  with pytest.raises(ValueError, match=r"share of the cache must be in \(0, 1\]"):
    attention.decode_attention(q, k, v, mask, jnp.int32(3), read_whole=1.5, dot_scores=False)


def test_auto_decode_attention_on_cpu_reads_mid_sized_caches_by_live_share():
  f32 = jnp.float32
  small = (jnp.zeros((8, 4, 32, 192), f32), jnp.zeros((8, 4, 192, 32), f32))  # 1.5 MiB
  mid = (jnp.zeros((8, 4, 32, 640), f32), jnp.zeros((8, 4, 640, 32), f32))  # 5 MiB
  big = (jnp.zeros((8, 4, 64, 1024), f32), jnp.zeros((8, 4, 1024, 64), f32))  # 16 MiB
  assert attention._cpu_read_whole(*small) is True
  assert attention._cpu_read_whole(*mid) == attention.CPU_DECODE_LIVE_SHARE
  assert attention._cpu_read_whole(*big) == attention.CPU_DECODE_LIVE_SHARE
  huge = (jnp.zeros((8, 4, 64, 2048), f32), jnp.zeros((8, 4, 2048, 64), f32))  # 32 MiB
  assert attention._cpu_read_whole(*huge) is False
