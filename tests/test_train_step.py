"""Sharded GRPO train step: device-count invariance, exact accumulation, TIS, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset
from spade_jax.registry import UnknownNameError
from spade_jax.rl import (BATCH_FIELDS, ROLES, LossConfig, OptimizerConfig, TrainConfig,
                          Trainer, batch_loss_terms, finalize_train_metrics)

CFG = get_preset("tiny")
B, T = 8, 64


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  seg = np.ones((B, T), np.int32)
  seg[:, 50:] = 0
  return dict(
      tokens=rng.integers(3, 259, (B, T)), positions=np.tile(np.arange(T), (B, 1)),
      segment_ids=seg, loss_mask=(rng.random((B, T)) < 0.6) & (seg > 0),
      advantages=rng.normal(size=B).astype(np.float32),
      role=np.array([0, 0, 1, 1, 1, 1, 1, 1]),
      # Spread over ~1.5 nats around the tiny model's ~-5.56, so TIS caps some.
      sampler_logps=rng.uniform(-6.3, -4.8, (B, T)).astype(np.float32))


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
  dirty["sampler_logps"] = np.where(masked, np.nan, clean["sampler_logps"]).astype(np.float32)
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


# ---------------------------------------------------------------------------
# Truncated importance sampling as the reference runs it (docs/METHOD.md §1.8):
# old_logps recomputed with the weights about to be updated (ratio 1), each
# token weighted by w = min(pi_old / pi_sampler, 2).
# ---------------------------------------------------------------------------

# A stale designer sample (row 0, A > 0) and an agent episode (row 1, A < 0):
# per token d = current - sampler log-prob, i.e. how far the policy drifted
# since sampling. |d| > log 2 = 0.693 makes the cap bind; log(1.28) = 0.247
# and log(0.8) = -0.223 are the PPO clip edges of the "sampler" ratio exp(d).
DRIFT = np.array([[0.0, 0.3, 0.9, 1.5, -0.4, 0.2, -1.2, 0.5],
                  [0.0, -0.4, 0.1, -1.0, 0.8, -0.1, 2.0, 0.3]])
ADV = np.array([1.5, -0.8])


def _golden_batch():
  rng = np.random.default_rng(3)
  lp = rng.uniform(-3.0, -0.5, DRIFT.shape)
  mask = np.ones(DRIFT.shape, bool)
  mask[:, 0] = False  # a sequence's first token is never trained on
  mask[1, 5] = False  # e.g. an observation inside an episode
  batch = dict(sampler_logps=lp - DRIFT, advantages=np.repeat(ADV[:, None], 8, 1),
               loss_mask=mask, segment_ids=np.ones(DRIFT.shape, np.int32),
               role=np.array([[0] * 8, [1] * 8]))
  return lp, {k: jnp.asarray(v) for k, v in batch.items()}


def _loss_grad_metrics(lp, batch, old_logps):
  def loss(x):
    s, d, m = batch_loss_terms(x, batch, old_logps=old_logps, config=LossConfig())
    return s / d, (s, d, m)
  (_, (s, d, m)), g = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(lp, jnp.float32))
  return np.asarray(g, np.float64), jax.device_get(finalize_train_metrics(s, d, m))


def test_golden_recompute_weights_every_token_by_capped_tis():
  lp, batch = _golden_batch()
  mask = np.asarray(batch["loss_mask"])
  n = mask.sum()  # token_mean: the loss is the mean over all loss tokens
  a = ADV[:, None]
  w = np.minimum(np.exp(DRIFT), 2.0)  # pi_old / pi_sampler with pi_old = current
  g, m = _loss_grad_metrics(lp, batch, "recompute")
  # loss_t = -r * A * w with r = exp(logp - stop_gradient(logp)) == 1 and
  # dr/dlogp = 1: d loss / d logp_t = -A * w_t / n on every loss token.
  np.testing.assert_allclose(g[mask], (-a * w / n)[mask], rtol=1e-5, atol=1e-8)
  assert np.all(g[~mask] == 0.0)
  assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0 and m["ratio_min"] == 1.0
  assert m["clip_frac_high"] == 0.0 and m["clip_frac_low"] == 0.0
  np.testing.assert_allclose(m["tis_weight_mean"], w[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(m["tis_weight_max"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(m["tis_weight_min"], w[mask].min(), rtol=1e-5)
  np.testing.assert_allclose(m["tis_capped_frac"], (DRIFT[mask] > np.log(2)).mean())
  np.testing.assert_allclose(m["tis_abs_diff_mean"], np.abs(DRIFT[mask]).mean(), rtol=1e-5)
  for r, name in enumerate(ROLES):
    np.testing.assert_allclose(m[f"{name}_tis_weight_mean"], w[r][mask[r]].mean(),
                               rtol=1e-5, err_msg=name)
    assert m[f"{name}_tokens"] == mask[r].sum()
  np.testing.assert_allclose(m["loss"], (-a * w)[mask].sum() / n, rtol=1e-5)


def test_golden_sampler_old_logps_silence_drifted_tokens():
  lp, batch = _golden_batch()
  mask = np.asarray(batch["loss_mask"])
  n = mask.sum()
  a = ADV[:, None]
  r = np.exp(DRIFT)  # the PPO ratio pi_theta / pi_sampler
  clipped = ((a > 0) & (r > 1.28)) | ((a < 0) & (r < 0.8))
  g, m = _loss_grad_metrics(lp, batch, "sampler")
  # w = min(exp(sampler - sampler), 2) = 1; clipped tokens get no gradient.
  want = np.where(clipped, 0.0, -a * r / n)
  np.testing.assert_allclose(g[mask], want[mask], rtol=1e-5, atol=1e-8)
  assert m["tis_weight_mean"] == 1.0 and m["tis_capped_frac"] == 0.0
  # The stale designer tokens that drifted in the advantage's direction:
  # silenced by "sampler", trained (with weight min(exp(d), 2)) by "recompute".
  drifted = mask & (a > 0) & (r > 1.28)
  assert drifted.sum() == 4
  assert np.all(g[drifted] == 0.0)
  g_rec, _ = _loss_grad_metrics(lp, batch, "recompute")
  assert np.all(g_rec[drifted] < 0.0)
  np.testing.assert_allclose(g_rec[drifted], (-a * np.minimum(r, 2.0) / n)[drifted],
                             rtol=1e-5)


def test_recompute_equals_sampler_when_sampler_is_current_policy():
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  opt = OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0)
  out = {}
  for mode in ("recompute", "sampler"):
    tr = Trainer(CFG, TrainConfig(B, T, logprob_chunk=16, old_logps=mode), LossConfig(),
                 opt, mesh, parallel.RULE_SETS["fsdp"])
    state = tr.init_state(jax.random.key(0))
    batch = _batch()
    if mode == "recompute":  # the policy's log-probs at the start of the update
      batch["sampler_logps"] = np.asarray(jax.jit(tr._logps)(
          state.params, {k: jnp.asarray(np.broadcast_to(
              np.asarray(v)[:, None] if np.ndim(v) == 1 else v, (B, T)))
              for k, v in batch.items()}))
      current = batch["sampler_logps"]
    else:
      batch["sampler_logps"] = current
    state, m = tr.step(state, batch)
    out[mode] = jax.device_get(state.params), jax.device_get(m)
  (p_r, m_r), (p_s, m_s) = out["recompute"], out["sampler"]
  for k in ("loss", "grad_norm", "tis_weight_mean", "ratio_mean"):
    np.testing.assert_allclose(m_s[k], m_r[k], rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(m_r["tis_weight_mean"], 1.0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p_s), jax.tree.leaves(p_r)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_recompute_is_the_same_forward_as_a_separate_recompute():
  """`old_logps="recompute"` takes the old log-probs from the gradient's own forward
  (one policy forward per step, `test_kl_reference_only_traced_when_used`). With one
  update per batch that equals the reference's separate recompute: a forward of the
  same weights without gradient, then the loss against it."""
  from spade_jax.rl import loss as loss_lib
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  loss_cfg = LossConfig()
  tr = Trainer(CFG, TrainConfig(B, T, logprob_chunk=16), loss_cfg, OptimizerConfig(),
               mesh, parallel.RULE_SETS["fsdp"])
  params = tr.init_state(jax.random.key(0)).params
  mb = tr._put(_batch())
  (f_loss, (f_den, f_sums)), f_grad = jax.jit(
      jax.value_and_grad(tr._micro_terms, has_aux=True))(params, None, mb)
  old = jax.jit(tr._logps)(params, mb)  # its own program: no gradient, no fusion

  def separate(p):
    s, d, m = loss_lib.grpo_loss_terms(
        tr._logps(p, mb), old, mb["advantages"], mb["loss_mask"],
        sampler_logps=mb["sampler_logps"], segment_ids=mb["segment_ids"],
        config=loss_cfg)
    return s, (d, m)

  (s_loss, (s_den, s_sums)), s_grad = jax.jit(
      jax.value_and_grad(separate, has_aux=True))(params)
  np.testing.assert_allclose(f_loss, s_loss, rtol=1e-6)
  assert f_den == s_den
  assert set(s_sums) <= set(f_sums)
  for k in s_sums:
    np.testing.assert_allclose(f_sums[k], s_sums[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert 0 < f_sums["tis_capped_count"] < f_sums["token_count"]  # the weights bite
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(f_grad),
                          jax.tree.leaves(s_grad)):
    # Float rounding of two differently fused programs: 1e-5 of the leaf's scale.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.max(np.abs(b)),
                               err_msg=jax.tree_util.keystr(path))


def test_step_reports_drift_metrics(single):
  m = single[1]
  for k in ("tis_weight_mean", "tis_weight_min", "tis_weight_max", "tis_capped_frac",
            "tis_abs_diff_mean", "designer_tis_weight_mean", "agent_tis_weight_mean"):
    assert k in m and np.isfinite(m[k]), k
  assert m["ratio_mean"] == 1.0  # recompute (the default): ratio exactly 1
  assert 0.0 < m["tis_weight_min"] <= m["tis_weight_mean"] <= m["tis_weight_max"] <= 2.0
  assert m["tis_capped_frac"] > 0.0  # sampler log-probs spread over ~1.5 nats


def test_old_logps_name_and_batch_list_errors():
  with pytest.raises(UnknownNameError, match=r"\['recompute', 'sampler'\].*train.old_logps"):
    TrainConfig(old_logps="trainer")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  tr = Trainer(CFG, TrainConfig(B, T, 1), LossConfig(), OptimizerConfig(), mesh,
               parallel.RULE_SETS["fsdp"])
  state = tr.init_state(jax.random.key(0))
  with pytest.raises(ValueError, match="empty sequence of batches"):
    tr.step(state, [])
  old = _batch()
  old["old_logps"] = old.pop("sampler_logps")
  with pytest.raises(ValueError, match=r"Batch 1 of 2 is missing field 'sampler_logps' "
                                       r"\(renamed from 'old_logps'"):
    tr.step(state, [_batch(), old])
