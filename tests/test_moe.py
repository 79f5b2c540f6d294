"""MoE: kernel equivalence, layer placement, aux loss vs HF, scan/remat options,
and sharded forward under every rule set."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import (ModelConfig, forward, get_preset, init_params, layer_segments,
                              load_balancing_loss, param_axes, segment_mask, token_logprobs)

CFG = get_preset("tiny_moe", num_layers=3, mlp_only_layers=(1,))


@pytest.fixture(scope="module")
def params():
  return jax.jit(init_params, static_argnums=1)(jax.random.key(0), CFG)


def _inputs(B=4, T=8, seed=1):
  toks = jax.random.randint(jax.random.key(seed), (B, T), 3, 259)
  pos = jnp.tile(jnp.arange(T), (B, 1))
  return toks, pos, segment_mask(jnp.ones_like(toks))


def test_layer_placement_follows_hf_rule():
  c = ModelConfig(num_layers=6, num_experts=4, num_experts_per_tok=1, moe_mlp_dim=8,
                  decoder_sparse_step=2)
  assert c.layer_is_moe == (False, True) * 3
  assert layer_segments(c) == [((False, True), 3)]
  c = dataclasses.replace(c, decoder_sparse_step=1, mlp_only_layers=[0, 4])
  assert c.layer_is_moe == (False, True, True, True, False, True)
  assert layer_segments(c) == [((False,), 1), ((True,), 3), ((False,), 1), ((True,), 1)]
  assert layer_segments(get_preset("qwen3_30b_a3b")) == [((True,), 48)]
  with pytest.raises(ValueError, match="mlp_only_layers"):
    ModelConfig(num_experts=4, num_experts_per_tok=1, moe_mlp_dim=8, mlp_only_layers=(9,))
  with pytest.raises(ValueError, match="num_experts_per_tok"):
    ModelConfig(num_experts=4, num_experts_per_tok=5, moe_mlp_dim=8)


def test_ragged_blocked_and_unrolled_agree(params):
  toks, pos, mask = _inputs()
  fwd = jax.jit(forward, static_argnums=1)
  ref, _ = fwd(params, CFG, toks, pos, mask)
  alt = dataclasses.replace(CFG, moe_impl="ragged", scan_layers=False)
  np.testing.assert_allclose(fwd(params, alt, toks, pos, mask)[0], ref, atol=2e-5)


@pytest.mark.slow
def test_remat_and_ragged_gradients_agree(params):
  toks, pos, _ = _inputs()

  @jax.jit
  def grads(p):
    loss = lambda p, cfg: token_logprobs(p, cfg, toks, pos, jnp.ones_like(toks)).sum()
    return (jax.grad(loss)(p, CFG),
            jax.grad(loss)(p, dataclasses.replace(CFG, remat="dots", moe_impl="ragged")))

  g0, g1 = grads(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g0, g1)
  assert float(jnp.abs(g0["moe"]["gate"]).sum()) > 0


def test_load_balancing_loss_matches_hf(params):
  torch = pytest.importorskip("torch")
  qmoe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
  toks, pos, mask = _inputs()
  _, _, rl = jax.jit(forward, static_argnums=(1, 7, 8))(params, CFG, toks, pos, mask,
                                                         None, 0, False, True)
  assert rl.shape == (CFG.num_moe_layers, 4, 8, CFG.num_experts)
  valid = np.ones((4, 8), np.int64)
  valid[1, :5] = 0
  ours = load_balancing_loss(rl, CFG, jnp.asarray(valid))
  ref = qmoe.load_balancing_loss_func(
      tuple(torch.tensor(np.asarray(l).reshape(-1, CFG.num_experts)) for l in rl),
      CFG.num_experts, CFG.num_experts_per_tok, torch.tensor(valid))
  np.testing.assert_allclose(float(ours), float(ref), rtol=1e-5)


@pytest.mark.parametrize("mesh_cfg", [
    parallel.MeshConfig(data=2, fsdp=4, rules="fsdp"),
    parallel.MeshConfig(data=2, fsdp=2, tensor=2, rules="fsdp_tensor"),
    parallel.MeshConfig(data=1, fsdp=2, tensor=2, expert=2, rules="fsdp_tensor_expert"),
    parallel.MeshConfig(data=-1, rules="replicated"),
])
def test_sharded_moe_forward_equals_single_device(params, mesh_cfg):
  mesh = parallel.make_mesh(mesh_cfg)
  rules = parallel.RULE_SETS[mesh_cfg.rules]
  shard = parallel.tree_shardings(param_axes(CFG), jax.tree.map(lambda x: x.shape, params),
                                  mesh, rules)
  sp = jax.device_put(params, shard)
  toks, pos, _ = _inputs(B=8)
  seg = jnp.ones_like(toks)
  ref = token_logprobs(params, CFG, toks, pos, seg)
  toks_s = jax.device_put(toks, parallel.batch_sharding(mesh, rules, 2))
  with parallel.activation_sharding(mesh, rules):
    got = jax.jit(lambda p, t: token_logprobs(p, CFG, t, pos, seg))(sp, toks_s)
  np.testing.assert_allclose(got, ref, atol=1e-5)
