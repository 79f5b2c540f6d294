"""MoE: kernel equivalence, layer placement, aux loss vs HF, scan/remat options,
sharded forward under every rule set, and the expert-parallel dispatch
(shard_map + all-to-all) against the global one, with and without capacity."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import (ModelConfig, forward, get_preset, init_params, layer_segments,
                              load_balancing_loss, moe, param_axes, segment_mask,
                              token_logprobs)
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer

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


# -- expert-parallel dispatch (shard_map + all-to-all) ---------------------------

MORE_EXPERTS = get_preset("tiny_moe", num_experts=16, num_experts_per_tok=4)


def _layer_inputs(cfg, B=8, T=8):
  p = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
  mp = jax.tree.map(lambda a: a[0], p["moe"])
  h = jax.random.normal(jax.random.key(1), (B, T, cfg.d_model))
  return mp, h


def _moe_value_and_grads(cfg):
  """A fresh jitted (loss, (out, dropped)), grads of one MoE layer (fresh: the
  sharding context is read at trace time, and jit caches traces per function)."""
  def loss(mp, h):
    out, logits, dropped = moe.moe_mlp(h, mp, cfg, return_dropped=True)
    probe = jnp.sin(jnp.arange(out.size, dtype=out.dtype).reshape(out.shape))
    return jnp.sum(out * probe) + 0.1 * jnp.sum(logits ** 2), (out, dropped)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _mesh(mesh_cfg):
  return parallel.make_mesh(mesh_cfg), parallel.RULE_SETS[mesh_cfg.rules]


_DATA2_EXPERT4 = parallel.MeshConfig(data=2, expert=4, rules="fsdp_tensor_expert")
_FSDP2_EXPERT4 = parallel.MeshConfig(data=1, fsdp=2, expert=4, rules="fsdp_tensor_expert")


@pytest.mark.parametrize("cfg,mesh_cfg", [
    (CFG, _DATA2_EXPERT4),
    (CFG, _FSDP2_EXPERT4),
    # Expert width split over `tensor`: partial sums psum'd before the return trip.
    (CFG, parallel.MeshConfig(data=1, fsdp=2, tensor=2, expert=2, rules="fsdp_tensor_expert")),
    # No expert axis: each device routes its own tokens over all (gathered) experts.
    (CFG, parallel.MeshConfig(data=-1, fsdp=2, rules="fsdp")),
    (MORE_EXPERTS, _DATA2_EXPERT4),
    (MORE_EXPERTS, _FSDP2_EXPERT4),
    (dataclasses.replace(CFG, moe_impl="ragged"), _FSDP2_EXPERT4),
], ids=["data2_expert4", "fsdp2_expert4", "fsdp2_tensor2_expert2", "data4_fsdp2",
        "16x4_data2_expert4", "16x4_fsdp2_expert4", "ragged_fsdp2_expert4"])
def test_expert_parallel_dispatch_equals_global(cfg, mesh_cfg):
  mp, h = _layer_inputs(cfg)
  (l0, (o0, d0)), g0 = _moe_value_and_grads(cfg)(mp, h)
  mesh, rules = _mesh(mesh_cfg)
  with parallel.activation_sharding(mesh, rules):
    fn = _moe_value_and_grads(cfg)
    hlo = fn.lower(mp, h).as_text()
    (l1, (o1, d1)), g1 = fn(mp, h)
  assert ("all_to_all" in hlo) == (mesh_cfg.expert > 1)
  assert "shard_map" in hlo or "sdy.manual_computation" in hlo
  assert int(d0) == int(d1) == 0
  np.testing.assert_allclose(o1, o0, atol=1e-5)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), g1, g0)


def test_one_device_and_uncovered_layouts_use_the_global_dispatch():
  mp, h = _layer_inputs(CFG)
  (l0, _), g0 = _moe_value_and_grads(CFG)(mp, h)
  one = parallel.make_mesh(parallel.MeshConfig(data=1), jax.devices()[:1])
  # Experts split over an axis the batch is not: every device routes the whole batch.
  mesh = parallel.make_mesh(parallel.MeshConfig(data=2, expert=4))
  for m, rules in ((one, parallel.RULE_SETS["fsdp_tensor_expert"]),
                   (mesh, (("batch", "data"), ("expert", "expert")))):
    with parallel.activation_sharding(m, rules):
      assert moe._expert_parallel_layout(h.shape, mp["gate"].shape, CFG) is None
      fn = _moe_value_and_grads(CFG)
      assert "all_to_all" not in fn.lower(mp, h).as_text()
      (l1, _), g1 = fn(mp, h)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g1, g0)


def _reference_with_drops(mp, h, cfg, devices, shards, cap):
  """Independent numpy golden: per device (contiguous token slices), each
  expert shard accepts the first `cap` tokens routed to it in token order."""
  x = np.asarray(h, np.float64).reshape(-1, cfg.d_model)
  logits = x @ np.asarray(mp["router"], np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ids = np.argsort(-probs, axis=-1, kind="stable")[:, :cfg.num_experts_per_tok]
  w = np.take_along_axis(probs, ids, -1)
  w /= w.sum(-1, keepdims=True)
  wg, wu, wd = (np.asarray(mp[n], np.float64) for n in ("gate", "up", "down"))
  per_shard = cfg.num_experts // shards
  out, dropped = np.zeros_like(x), 0
  n_local = x.shape[0] // devices
  for dev in range(devices):
    taken = np.zeros(shards, int)
    for n in range(dev * n_local, (dev + 1) * n_local):
      for s in sorted(set(ids[n] // per_shard)):
        mine = [j for j in range(ids.shape[1]) if ids[n, j] // per_shard == s]
        if taken[s] >= cap:
          dropped += len(mine)
          continue
        taken[s] += 1
        for j in mine:
          e = ids[n, j]
          g, u = x[n] @ wg[e], x[n] @ wu[e]
          out[n] += w[n, j] * ((g / (1 + np.exp(-g)) * u) @ wd[e])
  return out.reshape(h.shape), dropped


def test_capacity_factor_drops_and_counts_overflow():
  cfg = dataclasses.replace(MORE_EXPERTS, moe_capacity_factor=0.5)
  mp, h = _layer_inputs(cfg)
  mesh, rules = _mesh(_DATA2_EXPERT4)
  with parallel.activation_sharding(mesh, rules):
    (_, (out, dropped)), _ = _moe_value_and_grads(cfg)(mp, h)
  n_local = h.shape[0] * h.shape[1] // 8
  cap = math.ceil(0.5 * n_local * cfg.num_experts_per_tok / 4)   # c * N * k / E
  ref, ref_dropped = _reference_with_drops(mp, h, cfg, devices=8, shards=4, cap=cap)
  assert ref_dropped > 0 and int(dropped) == ref_dropped
  np.testing.assert_allclose(out, ref, atol=1e-5)
  # Without a capacity factor nothing is dropped and the golden matches too.
  exact, none = _reference_with_drops(mp, h, cfg, devices=8, shards=4, cap=n_local)
  assert none == 0
  (_, (o0, _)), _ = _moe_value_and_grads(MORE_EXPERTS)(mp, h)
  np.testing.assert_allclose(o0, exact, atol=1e-5)


def test_expert_parallel_model_gradients_equal_single_device(params):
  toks, pos, _ = _inputs(B=8)
  seg = jnp.ones_like(toks)
  cfg = dataclasses.replace(CFG, remat="full")
  loss = lambda p: token_logprobs(p, cfg, toks, pos, seg).sum()
  l0, g0 = jax.jit(jax.value_and_grad(loss))(params)
  mesh, rules = _mesh(_DATA2_EXPERT4)
  shard = parallel.tree_shardings(param_axes(CFG), jax.tree.map(lambda x: x.shape, params),
                                  mesh, rules)
  with parallel.activation_sharding(mesh, rules):
    l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(p)))(jax.device_put(params, shard))
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g1, g0)


def test_train_step_reports_capacity_drops(params):
  B, T, n = 16, 8, 2
  rng = np.random.default_rng(0)
  batch = dict(tokens=rng.integers(3, 259, (B, T)), positions=np.tile(np.arange(T), (B, 1)),
               segment_ids=np.ones((B, T), np.int32), loss_mask=np.ones((B, T), bool),
               advantages=rng.normal(size=B).astype(np.float32),
               sampler_logps=np.full((B, T), -5.5, np.float32), role=np.zeros((B, T), np.int32))
  mesh, rules = _mesh(_DATA2_EXPERT4)
  opt = OptimizerConfig(name="sgd", learning_rate=0.0, grad_clip=0.0)
  cfg = dataclasses.replace(CFG, moe_capacity_factor=0.5)
  tr = Trainer(cfg, TrainConfig(B, T, n, logprob_chunk=4), LossConfig(), opt, mesh, rules)
  state = tr.state_from_params(jax.tree.map(jnp.copy, params))  # the step donates it
  # What the capacity drops in each micro-batch, run as the step runs it.
  want = 0
  with parallel.activation_sharding(mesh, rules):
    dropped = lambda c: jax.jit(lambda p, t, q, s: forward(
        p, c, t, q, segment_mask(s), return_hidden=True, return_moe_dropped=True)[-1])
    for rows in np.split(np.arange(B), n):
      put = lambda a: jax.device_put(jnp.asarray(a[rows]), tr.batch_shardings["tokens"])
      args = (state.params, put(batch["tokens"]), put(batch["positions"]),
              put(batch["segment_ids"]))
      want += int(dropped(cfg)(*args))
      # Scanned and unrolled layers count the same drops.
      assert int(dropped(dataclasses.replace(cfg, scan_layers=False))(*args)) == int(
          dropped(cfg)(*args))
  _, m = tr.step(state, batch)
  assert want > 0 and int(m["moe_dropped_copies"]) == want
  routed = B * T * cfg.num_experts_per_tok * cfg.num_moe_layers
  np.testing.assert_allclose(m["moe_dropped_frac"], want / routed, rtol=1e-6)
  # Without a capacity factor nothing is dropped and nothing is reported.
  tr0 = Trainer(CFG, TrainConfig(B, T, n, logprob_chunk=4), LossConfig(), opt, mesh, rules)
  _, m0 = tr0.step(tr0.state_from_params(jax.tree.map(jnp.copy, params)), batch)
  assert "moe_dropped_copies" not in m0 and "moe_dropped_frac" not in m0
