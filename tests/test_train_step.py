"""Sharded GRPO train step: device-count invariance, exact accumulation, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset
from spade_jax.rl import (BATCH_FIELDS, LossConfig, OptimizerConfig, TrainConfig,
                          Trainer)

CFG = get_preset("tiny")
B, T = 8, 64


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  seg = np.ones((B, T), np.int32)
  seg[:, 50:] = 0
  return dict(
      tokens=rng.integers(3, 259, (B, T)), positions=np.tile(np.arange(T), (B, 1)),
      segment_ids=seg, loss_mask=(rng.random((B, T)) < 0.6) & (seg > 0),
      old_logps=np.full((B, T), -5.5, np.float32),
      advantages=rng.normal(size=B).astype(np.float32),
      role=np.array([0, 0, 1, 1, 1, 1, 1, 1]))


def _run(mesh_cfg, devices, microbatches=1, loss=LossConfig(), steps=2,
         opt=OptimizerConfig(learning_rate=1e-3), chunk=16):
  mesh = parallel.make_mesh(mesh_cfg, devices)
  tr = Trainer(CFG, TrainConfig(B, T, microbatches, logprob_chunk=chunk), loss, opt,
               mesh, parallel.RULE_SETS[mesh_cfg.rules])
  state = tr.init_state(jax.random.key(0))
  for i in range(steps):
    state, m = tr.step(state, _batch(i))
  return jax.device_get(state.params), jax.device_get(m)


@pytest.fixture(scope="module")
def single():
  return _run(parallel.MeshConfig(), jax.devices()[:1])


@pytest.mark.parametrize("mesh_cfg", [
    parallel.MeshConfig(data=1, fsdp=-1, rules="fsdp"),
    parallel.MeshConfig(data=2, fsdp=2, tensor=2, rules="fsdp_tensor"),
])
def test_eight_devices_match_one(single, mesh_cfg):
  params, m = _run(mesh_cfg, jax.devices())
  np.testing.assert_allclose(m["loss"], single[1]["loss"], rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(single[0])):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("opt", [
    OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0),  # params move by the raw gradient
    # The reference AdamW recipe (lr 1e-6). Adam's first step is ~lr * sign(g), so with a
    # large lr fp32 noise on near-zero gradients would flip whole updates; SGD above is
    # the strict check of the accumulated gradient.
    OptimizerConfig(),
])
def test_four_microbatches_equal_full_batch(opt):
  one = _run(parallel.MeshConfig(), jax.devices()[:1], microbatches=1, opt=opt, steps=1)
  four = _run(parallel.MeshConfig(), jax.devices()[:1], microbatches=4, opt=opt, steps=1)
  np.testing.assert_allclose(four[1]["loss"], one[1]["loss"], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(four[1]["grad_norm"], one[1]["grad_norm"], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(four[0]), jax.tree.leaves(one[0])):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_role_token_counts_and_metrics(single):
  m = single[1]
  b = _batch(1)
  assert m["designer_tokens"] == b["loss_mask"][:2].sum()
  assert m["agent_tokens"] == b["loss_mask"][2:].sum()
  assert np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0


def test_kl_reference_only_traced_when_used(monkeypatch):
  from spade_jax.rl import train_step
  calls = []
  real = train_step.chunked_token_logprobs
  monkeypatch.setattr(train_step, "chunked_token_logprobs",
                      lambda *a, **k: (calls.append(1), real(*a, **k))[1])
  _run(parallel.MeshConfig(), jax.devices()[:1], steps=1)
  assert len(calls) == 1  # policy only
  calls.clear()
  _, m = _run(parallel.MeshConfig(), jax.devices()[:1], steps=1,
              loss=LossConfig(kl_coef=0.01))
  assert len(calls) == 2 and "kl" in m


def test_bad_batch_and_split_errors():
  mesh = parallel.make_mesh(parallel.MeshConfig())
  with pytest.raises(ValueError, match="cannot be split over 8 batch shards"):
    Trainer(CFG, TrainConfig(4, T, 1), LossConfig(), OptimizerConfig(), mesh,
            parallel.RULE_SETS["fsdp"])
  tr = Trainer(CFG, TrainConfig(B, T, 1), LossConfig(), OptimizerConfig(), mesh,
               parallel.RULE_SETS["fsdp"])
  bad = _batch()
  bad["tokens"] = bad["tokens"][:, :10]
  with pytest.raises(ValueError, match="'tokens' has shape"):
    tr.step(tr.init_state(jax.random.key(0)), bad)


def test_chunked_logprobs_step_equals_full_logits(single):
  params, m = _run(parallel.MeshConfig(), jax.devices()[:1], chunk=0)
  np.testing.assert_allclose(m["loss"], single[1]["loss"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m["grad_norm"], single[1]["grad_norm"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(single[0])):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_masked_tokens_get_exactly_zero_gradient():
  """Through the chunked log-probs: garbage on masked tokens changes nothing."""
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  tr = Trainer(CFG, TrainConfig(B, T, logprob_chunk=16), LossConfig(kl_coef=0.0),
               OptimizerConfig(), mesh, parallel.RULE_SETS["fsdp"])
  params = tr.init_state(jax.random.key(0)).params
  grad = jax.jit(jax.grad(lambda p, mb: tr._micro_terms(p, None, mb)[0]))
  as_jax = lambda b: {k: jnp.asarray(np.broadcast_to(
      np.asarray(v)[:, None] if np.ndim(v) == 1 else v, (B, T)), BATCH_FIELDS[k])
                      for k, v in b.items()}
  clean = _batch()
  dirty = dict(clean)
  masked = ~clean["loss_mask"]
  dirty["old_logps"] = np.where(masked, np.nan, clean["old_logps"]).astype(np.float32)
  dirty["advantages"] = np.where(masked, np.inf, clean["advantages"][:, None])
  pad = clean["segment_ids"] == 0  # padding tokens: nothing attends to them
  dirty["tokens"] = np.where(pad, 7, clean["tokens"])
  g_clean, g_dirty = grad(params, as_jax(clean)), grad(params, as_jax(dirty))
  for a, b in zip(jax.tree.leaves(g_clean), jax.tree.leaves(g_dirty)):
    np.testing.assert_array_equal(a, b)
  none = dict(clean, loss_mask=np.zeros((B, T), bool))
  assert all(np.all(g == 0) for g in jax.tree.leaves(grad(params, as_jax(none))))


def test_per_token_fields_accepted_and_checked():
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  tr = Trainer(CFG, TrainConfig(B, T, logprob_chunk=16), LossConfig(),
               OptimizerConfig(learning_rate=1e-3), mesh, parallel.RULE_SETS["fsdp"])
  state = tr.init_state(jax.random.key(0))
  row = _batch()
  tok = dict(row, advantages=np.repeat(row["advantages"][:, None], T, 1),
             role=np.repeat(row["role"][:, None], T, 1))
  _, m_row = tr.step(state, row)
  state = tr.init_state(jax.random.key(0))
  _, m_tok = tr.step(state, tok)
  np.testing.assert_allclose(m_tok["loss"], m_row["loss"], rtol=1e-6)
  assert m_tok["agent_tokens"] == m_row["agent_tokens"]
  with pytest.raises(ValueError, match=r"'advantages' has shape \(8, 3\)"):
    tr.step(state, dict(row, advantages=np.zeros((B, 3))))


@pytest.mark.slow
def test_benchmark_scripts_smoke(tmp_path):
  import argparse
  from experiments.benchmarks import gpu_mfu, plan_memory
  (r,) = gpu_mfu.main(["--smoke", f"--out={tmp_path}"])
  assert (tmp_path / "gpu_mfu.json").exists() and r["tokens_per_s"] > 0
  args = plan_memory._parse(["--devices=8", "--seq_len=64", "--logprob_chunk=16"])
  out = plan_memory.plan("tiny", args)
  assert out["fits"] and out["argument"] > 0 and out["mesh"]["fsdp"] == 8
