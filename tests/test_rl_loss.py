"""GRPO loss family against an independent NumPy (float64, plain loops) model."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.rl import loss as rl_loss

B, T = 8, 6
DUAL_C = 1.4
TIS_CAP = 1.3

# ---------------------------------------------------------------------------
# NumPy reference
# ---------------------------------------------------------------------------


def np_kl(name, lp, ref):
  if name == "k1":
    return lp - ref
  if name == "k2":
    return 0.5 * (lp - ref) ** 2
  d = ref - lp
  return math.exp(d) - d - 1.0


def np_loss(cfg, lp, old, adv, mask, ref=None, sampler=None):
  """Returns (loss, metrics) computed token by token."""
  lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
  nb, nt = lp.shape
  per = [[None] * nt for _ in range(nb)]
  ratios, ents, kls, drifts, olds, samps, weights = [], [], [], [], [], [], []
  clip_low = clip_high = dual = capped = 0
  for b in range(nb):
    toks = [t for t in range(nt) if mask[b][t]]
    if cfg.ratio_level == "sequence" and toks:
      seq_r = math.exp(sum(lp[b][t] - old[b][t] for t in toks) / len(toks))
    a = adv[b]
    for t in toks:
      r = seq_r if cfg.ratio_level == "sequence" else math.exp(lp[b][t] - old[b][t])
      rc = min(max(r, lo), hi)
      s = min(r * a, rc * a)
      if cfg.dual_clip is not None and a < 0:
        s = max(s, cfg.dual_clip * a)
        dual += r > cfg.dual_clip
      clip_low += a < 0 and r < lo
      clip_high += a > 0 and r > hi
      val = -s
      if sampler is not None:
        d = old[b][t] - sampler[b][t]
        drifts.append(abs(d))
        olds.append(old[b][t])
        samps.append(sampler[b][t])
        if cfg.tis_cap is not None:
          w = min(math.exp(d), cfg.tis_cap)  # docs/METHOD.md §1.8: min(pi_old / pi_sampler, cap)
          weights.append(w)
          val *= w
          capped += math.exp(d) > cfg.tis_cap
      if ref is not None:
        k = np_kl(cfg.kl_estimator, lp[b][t], ref[b][t])
        kls.append(k)
        val += cfg.kl_coef * k
      val += cfg.entropy_coef * lp[b][t]
      per[b][t] = val
      ratios.append(r)
      ents.append(-lp[b][t])
  row_sums = [sum(v for v in row if v is not None) for row in per]
  row_counts = [sum(v is not None for v in row) for row in per]
  if cfg.aggregation == "token_mean":
    loss = sum(row_sums) / sum(row_counts)
  elif cfg.aggregation == "seq_mean_token_mean":
    means = [s / c for s, c in zip(row_sums, row_counts) if c > 0]
    loss = sum(means) / len(means)
  else:
    norm = nt if cfg.dr_grpo_norm is None else cfg.dr_grpo_norm
    loss = sum(row_sums) / (nb * norm)
  n = len(ratios)
  m = {
      "token_count": n,
      "clip_frac_low": clip_low / n,
      "clip_frac_high": clip_high / n,
      "ratio_mean": sum(ratios) / n,
      "ratio_max": max(ratios),
      "ratio_min": min(ratios),
      "entropy": sum(ents) / n,
      "loss": loss,
  }
  if cfg.dual_clip is not None:
    m["dual_clip_frac"] = dual / n
  if ref is not None:
    m["kl"] = sum(kls) / n
  if sampler is not None:
    m["tis_abs_diff_mean"] = sum(drifts) / n
    m["tis_abs_diff_max"] = max(drifts)
    m["tis_capped_frac"] = capped / n
    m["tis_corr"] = float(np.corrcoef(olds, samps)[0, 1])
    if cfg.tis_cap is not None:
      m["tis_weight_mean"] = sum(weights) / n
      m["tis_weight_max"] = max(weights)
      m["tis_weight_min"] = min(weights)
  return loss, m


def np_grad(cfg, lp, *args, h=1e-6):
  """Central finite differences of the NumPy loss w.r.t. logps."""
  g = np.zeros_like(lp)
  for b, t in itertools.product(range(lp.shape[0]), range(lp.shape[1])):
    up, dn = lp.copy(), lp.copy()
    up[b, t] += h
    dn[b, t] -= h
    g[b, t] = (np_loss(cfg, up, *args)[0] - np_loss(cfg, dn, *args)[0]) / (2 * h)
  return g


# ---------------------------------------------------------------------------
# Fixed tiny batch
# ---------------------------------------------------------------------------


def make_batch():
  rng = np.random.default_rng(7)
  mask = np.ones((B, T), dtype=bool)
  mask[0, 4:] = False           # right padding
  mask[1, 1:3] = False          # hole (e.g. tool output inside a turn)
  mask[2, :] = False            # empty row
  mask[3, :] = False            # empty row (micro-batch [2:4] has no tokens)
  mask[5, 0] = False
  mask[6, 2:] = False
  old = rng.uniform(-3.0, -0.1, size=(B, T))
  lp = old + rng.normal(0.0, 0.35, size=(B, T))
  ref = lp + rng.normal(0.0, 0.3, size=(B, T))
  sampler = old + rng.normal(0.0, 0.3, size=(B, T))
  adv = np.array([1.2, -0.9, 0.5, -0.3, -1.5, 0.7, -0.6, 0.0])
  # Masked entries hold garbage that must not leak into loss or gradient.
  for x in (lp, old, ref, sampler):
    x[~mask] = np.nan
  lp[0, 5] = np.inf
  old[1, 1] = -np.inf
  return dict(lp=lp, old=old, adv=adv, mask=mask, ref=ref, sampler=sampler)


BATCH = make_batch()


def check_no_kinks(lp, old, mask):
  """Finite differences need every ratio away from the clip boundaries."""
  edges = (1 - 0.2, 1 + 0.28, DUAL_C)
  r_tok = np.exp(lp - old)[mask]
  r_seq = [
      math.exp(np.mean((lp - old)[b][mask[b]])) for b in range(B) if mask[b].any()
  ]
  for r in list(r_tok) + r_seq:
    assert min(abs(r - e) for e in edges) > 1e-3, r


def test_batch_exercises_every_branch():
  lp, old, adv, mask = (BATCH[k] for k in ("lp", "old", "adv", "mask"))
  check_no_kinks(lp, old, mask)
  _, met = np_loss(
      rl_loss.LossConfig(dual_clip=DUAL_C, tis_cap=TIS_CAP),
      lp, old, adv, mask, BATCH["ref"], BATCH["sampler"],
  )
  assert met["clip_frac_low"] > 0 and met["clip_frac_high"] > 0
  assert met["dual_clip_frac"] > 0 and 0 < met["tis_capped_frac"] < 1


def jax_inputs(batch, sl=slice(None)):
  f = lambda k: jnp.asarray(batch[k][sl], jnp.float32)
  return dict(
      logps=f("lp"), old_logps=f("old"), advantages=f("adv"),
      mask=jnp.asarray(batch["mask"][sl]), ref_logps=f("ref"),
      sampler_logps=f("sampler"),
  )


def jax_loss_and_grad(inputs, config, use_ref, use_sampler):
  """Eager on purpose: one XLA compile per config would dominate the runtime.

  `test_config_is_hashable_static_arg` and the micro-batch test cover jit.
  """
  inputs = dict(inputs)
  if not use_ref:
    inputs.pop("ref_logps")
  if not use_sampler:
    inputs.pop("sampler_logps")
  lp = inputs.pop("logps")
  f = lambda x: rl_loss.grpo_loss(x, **inputs, config=config)
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(lp)
  return loss, metrics, grad


GRID = list(itertools.product(
    sorted(rl_loss.KL_ESTIMATORS),
    sorted(rl_loss.AGGREGATIONS),
    rl_loss.RATIO_LEVELS,
    (None, DUAL_C),
    (False, True),
))


@pytest.mark.parametrize("kl_est,agg,level,dual,tis", GRID)
def test_matches_numpy(kl_est, agg, level, dual, tis):
  cfg = rl_loss.LossConfig(
      dual_clip=dual, ratio_level=level, kl_coef=0.1, kl_estimator=kl_est,
      aggregation=agg, dr_grpo_norm=(10 if agg == "dr_grpo" and dual else None),
      tis_cap=TIS_CAP if tis else None, entropy_coef=0.03,
  )
  b = BATCH
  sampler = b["sampler"] if tis else None
  args = (b["lp"], b["old"], b["adv"], b["mask"], b["ref"], sampler)
  want_loss, want_metrics = np_loss(cfg, *args)
  loss, metrics, grad = jax_loss_and_grad(
      jax_inputs(b), cfg, use_ref=True, use_sampler=tis
  )
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
  assert set(metrics) == set(want_metrics)
  for k, v in want_metrics.items():
    np.testing.assert_allclose(metrics[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
  mask = b["mask"]
  clean_lp = np.where(mask, b["lp"], 0.0)
  want_grad = np_grad(cfg, clean_lp, *args[1:])
  np.testing.assert_allclose(
      np.asarray(grad)[mask], want_grad[mask], rtol=1e-3, atol=1e-5
  )
  assert np.all(np.asarray(grad)[~mask] == 0.0)


@pytest.mark.parametrize("agg", sorted(rl_loss.AGGREGATIONS))
@pytest.mark.parametrize("level", rl_loss.RATIO_LEVELS)
def test_micro_batches_are_exact(agg, level):
  cfg = rl_loss.LossConfig(
      aggregation=agg, ratio_level=level, dual_clip=3.0, kl_coef=0.05
  )
  full = jax_inputs(BATCH)
  terms = jax.jit(
      functools.partial(rl_loss.grpo_loss_terms, config=cfg)
  )
  want_loss, want_metrics = rl_loss.grpo_loss(**full, config=cfg)
  acc_sum, acc_den, acc_m = 0.0, 0.0, None
  for i in range(4):
    part = jax_inputs(BATCH, slice(2 * i, 2 * i + 2))
    s, d, m = terms(part.pop("logps"), **part)
    acc_sum, acc_den = acc_sum + s, acc_den + d
    acc_m = m if acc_m is None else rl_loss.combine_metric_sums(acc_m, m)
  np.testing.assert_allclose(
      rl_loss.finalize_loss(acc_sum, acc_den), want_loss, atol=1e-6, rtol=0
  )
  got = rl_loss.finalize_metrics(acc_m)
  for k, v in got.items():
    np.testing.assert_allclose(v, want_metrics[k], atol=1e-5, rtol=1e-5, err_msg=k)


def test_masked_tokens_get_zero_gradient_and_do_not_matter():
  cfg = rl_loss.LossConfig(kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0)
  inp = jax_inputs(BATCH)
  lp = inp.pop("logps")
  f = lambda x: rl_loss.grpo_loss(x, **inp, config=cfg)[0]
  grad = jax.grad(f)(lp)
  mask = BATCH["mask"]
  assert np.all(np.isfinite(np.asarray(grad)))
  assert np.all(np.asarray(grad)[~mask] == 0.0)
  assert np.any(np.asarray(grad)[mask] != 0.0)
  # Different garbage in masked slots leaves the loss unchanged.
  other = {k: jnp.where(inp["mask"], v, 123.0) if v.ndim == 2 else v
           for k, v in inp.items() if k != "mask"}
  np.testing.assert_array_equal(
      f(lp), rl_loss.grpo_loss(jnp.where(inp["mask"], lp, -7.0), mask=inp["mask"],
                               **other, config=cfg)[0]
  )


def test_kl_disabled_needs_no_reference():
  inp = jax_inputs(BATCH)
  inp.pop("ref_logps")
  loss, metrics = rl_loss.grpo_loss(**inp, config=rl_loss.LossConfig())
  assert np.isfinite(loss) and "kl" not in metrics
  with pytest.raises(ValueError, match="ref_logps"):
    rl_loss.grpo_loss(**inp, config=rl_loss.LossConfig(kl_coef=0.1))


def test_config_is_hashable_static_arg():
  a = rl_loss.LossConfig(dual_clip=3.0)
  assert hash(a) == hash(rl_loss.LossConfig(dual_clip=3.0))
  inp = jax_inputs(BATCH)
  f = jax.jit(rl_loss.grpo_loss, static_argnames="config")
  f(**inp, config=a)


def test_all_masked_batch_is_zero_not_nan():
  inp = jax_inputs(BATCH)
  inp["mask"] = jnp.zeros((B, T), bool)
  for agg in rl_loss.AGGREGATIONS:
    loss, metrics = rl_loss.grpo_loss(
        **inp, config=rl_loss.LossConfig(aggregation=agg)
    )
    assert float(loss) == 0.0
    assert all(np.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kl_estimator="k4"), r"k1.*k2.*k3"),
        (dict(aggregation="seq_mean"), r"dr_grpo.*seq_mean_token_mean.*token_mean"),
        (dict(ratio_level="tok"), r"sequence"),
        (dict(dual_clip=0.5), r"dual_clip"),
        (dict(tis_cap=0.0), r"tis_cap"),
        (dict(dr_grpo_norm=0), r"dr_grpo_norm"),
    ],
)
def test_bad_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    rl_loss.LossConfig(**kwargs)


def test_unknown_registry_names_raise():
  with pytest.raises(ValueError, match="k3"):
    rl_loss.KL_ESTIMATORS["kl"]
  with pytest.raises(ValueError, match="token_mean"):
    rl_loss.AGGREGATIONS["sum"]


def test_bad_shapes_raise():
  inp = jax_inputs(BATCH)
  inp["advantages"] = inp["advantages"][:, None]
  with pytest.raises(ValueError, match="advantages"):
    rl_loss.grpo_loss(**inp)


# ---------------------------------------------------------------------------
# Packed rows: several sequences per row, keyed by segment ids
# ---------------------------------------------------------------------------

PAD = 2  # padding tokens (segment 0) at the end of each packed row


def pack_pairs(batch):
  """Rows (0, 1), (2, 3), ... of BATCH packed into one row each, plus padding.

  Returns the packed inputs and the [B, T] -> packed index map.
  """
  out = {}
  for k in ("lp", "old", "ref", "sampler"):
    x = batch[k].reshape(B // 2, 2 * T)
    out[k] = np.concatenate([x, np.full((B // 2, PAD), np.nan)], axis=1)
  mask = batch["mask"].reshape(B // 2, 2 * T)
  # Padding is marked trainable on purpose: segment 0 must win over the mask.
  out["mask"] = np.concatenate([mask, np.ones((B // 2, PAD), bool)], axis=1)
  seg = np.repeat(np.array([[1, 2]]), T, axis=1).repeat(B // 2, axis=0)
  out["seg"] = np.concatenate([seg, np.zeros((B // 2, PAD), int)], axis=1)
  adv = np.repeat(batch["adv"], T).reshape(B // 2, 2 * T)
  out["adv"] = np.concatenate([adv, np.full((B // 2, PAD), np.inf)], axis=1)
  return out


def packed_inputs(p):
  f = lambda k: jnp.asarray(p[k], jnp.float32)
  return dict(logps=f("lp"), old_logps=f("old"), advantages=f("adv"),
              mask=jnp.asarray(p["mask"]), ref_logps=f("ref"),
              sampler_logps=f("sampler"), segment_ids=jnp.asarray(p["seg"]))


@pytest.mark.parametrize("agg", sorted(rl_loss.AGGREGATIONS))
@pytest.mark.parametrize("level", rl_loss.RATIO_LEVELS)
def test_packed_rows_equal_one_sequence_per_row(agg, level):
  cfg = rl_loss.LossConfig(
      aggregation=agg, ratio_level=level, dual_clip=DUAL_C, kl_coef=0.1,
      tis_cap=TIS_CAP, entropy_coef=0.03, dr_grpo_norm=10)
  want_loss, want_m, want_g = jax_loss_and_grad(jax_inputs(BATCH), cfg, True, True)
  packed = packed_inputs(pack_pairs(BATCH))
  lp = packed.pop("logps")
  f = lambda x: rl_loss.grpo_loss(x, **packed, config=cfg)
  (loss, m), g = jax.value_and_grad(f, has_aux=True)(lp)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6, atol=1e-7)
  assert set(m) == set(want_m)
  for k in want_m:
    np.testing.assert_allclose(m[k], want_m[k], rtol=1e-5, atol=1e-6, err_msg=k)
  g = np.asarray(g)
  np.testing.assert_allclose(g[:, :2 * T].reshape(B, T), want_g, rtol=1e-5, atol=1e-7)
  assert np.all(g[:, 2 * T:] == 0.0)


def test_per_token_advantages_equal_per_row():
  cfg = rl_loss.LossConfig(ratio_level="sequence", aggregation="seq_mean_token_mean")
  inp = jax_inputs(BATCH)
  want = rl_loss.grpo_loss(**inp, config=cfg)[0]
  inp["advantages"] = jnp.broadcast_to(inp["advantages"][:, None], (B, T))
  np.testing.assert_allclose(rl_loss.grpo_loss(**inp, config=cfg)[0], want, rtol=1e-6)


def test_sequences_from_segment_ids():
  seg = jnp.array([[1, 1, 2, 2, 2, 0], [5, 5, 5, 5, 5, 5]])
  s = rl_loss.sequences(seg.shape, seg)
  np.testing.assert_array_equal(s.ids, [[0, 0, 1, 1, 1, 2], [6, 6, 6, 6, 6, 6]])
  assert s.num == 12
  np.testing.assert_array_equal(np.nonzero(np.asarray(s.present))[0], [0, 1, 6])


def test_packed_micro_batches_are_exact():
  cfg = rl_loss.LossConfig(aggregation="seq_mean_token_mean", ratio_level="sequence",
                           kl_coef=0.05)
  p = packed_inputs(pack_pairs(BATCH))
  want = rl_loss.grpo_loss(**p, config=cfg)[0]
  acc_s = acc_d = 0.0
  for i in range(2):
    part = {k: v[2 * i:2 * i + 2] for k, v in p.items()}
    s, d, _ = rl_loss.grpo_loss_terms(part.pop("logps"), **part, config=cfg)
    acc_s, acc_d = acc_s + s, acc_d + d
  np.testing.assert_allclose(rl_loss.finalize_loss(acc_s, acc_d), want, atol=1e-6)
