"""GRPO batch layout: first-fit packing, overflow batches, segments, per-token fields."""

import jax
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer
from spade_jax.selfplay.batch import Row, build_batches


def _row(n, adv=0.5, role="agent", start=10):
  return Row(list(range(start, start + n)), [i % 3 != 0 for i in range(n)],
             [-0.1 * i for i in range(n)], adv, role)


def test_packed_layout():
  rows = [_row(5, 1.0, "designer"), _row(7, -2.0), _row(3, 0.25), _row(6, 3.0)]
  (out,), stats = build_batches(rows, batch_size=3, seq_len=8, pad_id=0)
  assert all(v.shape == (3, 8) for v in out.values())
  # First fit in input order: 5 -> row 0, 7 -> row 1, 3 -> row 0 after the 5,
  # 6 -> row 2.
  np.testing.assert_array_equal(out["segment_ids"], [[1] * 5 + [2] * 3, [1] * 7 + [0],
                                                     [1] * 6 + [0, 0]])
  np.testing.assert_array_equal(out["positions"][0], [0, 1, 2, 3, 4, 0, 1, 2])
  np.testing.assert_array_equal(out["tokens"][0], [10, 11, 12, 13, 14, 10, 11, 12])
  np.testing.assert_array_equal(out["advantages"][0], [1.0] * 5 + [0.25] * 3)
  np.testing.assert_array_equal(out["role"][0], [0] * 5 + [1] * 3)
  np.testing.assert_allclose(out["sampler_logps"][0, 5:], [0.0, -0.1, -0.2], atol=1e-7)
  # Segment starts are never trained on; padding never is.
  assert not out["loss_mask"][0, 0] and not out["loss_mask"][0, 5]
  np.testing.assert_array_equal(out["loss_mask"][0, 5:], [False, True, True])
  assert not out["loss_mask"][out["segment_ids"] == 0].any()
  assert stats["batch/rows"] == 4 and stats["batch/batches"] == 1
  assert "batch/dropped_rows" not in stats
  assert stats["batch/rows_used"] == 3 and stats["batch/designer_rows"] == 1
  assert stats["batch/agent_rows"] == 3
  assert stats["batch/packing_efficiency"] == pytest.approx(21 / 24)
  assert stats["batch/loss_tokens"] == out["loss_mask"].sum()


def test_overflow_goes_to_further_batches_never_dropped():
  """4 long + 8 short sequences that one [2, 64] batch cannot hold: all kept."""
  lengths = [50, 45, 55, 40, 10, 8, 12, 6, 9, 14, 7, 11]
  rows = [_row(n, float(i), "designer" if i < 2 else "agent", start=i)
          for i, n in enumerate(lengths)]
  batches, stats = build_batches(rows, batch_size=2, seq_len=64)
  # First fit over all rows opened so far, in input order: 50 -> r0, 45 -> r1,
  # 55 -> r2, 40 -> r3, 10 -> r0, 8 -> r1, 12 -> r3, 6 -> r1, 9 -> r2, 14 -> r4
  # (fits nowhere), 7 -> r3, 11 -> r4. Rows r0..r4 make 3 batches of 2 rows.
  assert len(batches) == 3 and stats["batch/batches"] == 3
  assert all(v.shape == (2, 64) for b in batches for v in b.values())
  seg = np.concatenate([b["segment_ids"] for b in batches])
  assert [int(s.max()) for s in seg] == [2, 3, 2, 3, 2, 0]
  adv = np.concatenate([b["advantages"] for b in batches])
  np.testing.assert_array_equal(adv[4, :14], 9.0)      # the 14-token row
  np.testing.assert_array_equal(adv[4, 14:25], 11.0)   # then the 11-token row
  # Every sequence is there exactly once, with all its tokens.
  assert (seg > 0).sum() == sum(lengths)
  assert stats["batch/rows"] == 12 and stats["batch/rows_used"] == 5
  assert stats["batch/cut_tokens"] == 0
  assert stats["batch/designer_rows"] == 2 and stats["batch/agent_rows"] == 10
  assert stats["batch/packing_efficiency"] == pytest.approx(sum(lengths) / (3 * 2 * 64))
  assert stats["batch/loss_tokens"] == sum(b["loss_mask"].sum() for b in batches)


def test_unpacked_layout_cut_never_dropped():
  rows = [_row(5), _row(12), _row(3)]
  batches, stats = build_batches(rows, batch_size=2, seq_len=8, pack=False)
  assert len(batches) == 2 and stats["batch/rows"] == 3
  np.testing.assert_array_equal(batches[0]["segment_ids"].max(axis=1), [1, 1])
  np.testing.assert_array_equal(batches[1]["segment_ids"].max(axis=1), [1, 0])
  np.testing.assert_array_equal(batches[0]["tokens"][1], range(10, 18))  # cut, kept
  assert stats["batch/cut_tokens"] == 4
  packed, pstats = build_batches(rows, batch_size=2, seq_len=8)
  assert len(packed) == 1  # 5 + 3 share a row
  assert pstats["batch/packing_efficiency"] == 1.0


def test_no_rows_gives_one_padding_batch():
  batches, stats = build_batches([], batch_size=2, seq_len=8)
  assert len(batches) == 1 and not batches[0]["loss_mask"].any()
  assert stats["batch/rows"] == 0 and stats["batch/loss_tokens"] == 0


def test_bad_row_raises():
  with pytest.raises(ValueError, match="differ in length"):
    Row([1, 2], [True], [0.0, 0.0], 0.0, "agent")
  with pytest.raises(ValueError, match="role"):
    Row([1], [True], [0.0], 0.0, "critic")


def test_packed_update_equals_one_sequence_per_row():
  """Same sequences, packed 2 per row or 1 per row: same loss and params."""
  rng = np.random.default_rng(0)
  lengths = [30, 20, 25, 28, 10, 14, 31, 16]
  rows = [Row(list(rng.integers(3, 259, n)), list(rng.random(n) < 0.7),
              list(rng.uniform(-6, -4, n)), float(rng.normal()),
              "designer" if i < 2 else "agent") for i, n in enumerate(lengths)]
  cfg = get_preset("tiny")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  loss = LossConfig(aggregation="seq_mean_token_mean", ratio_level="sequence")
  opt = OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0)
  results = []
  for b, t, pack in ((8, 32, False), (4, 64, True)):
    (batch,), stats = build_batches(rows, b, t, pack=pack)
    assert stats["batch/rows"] == 8
    tr = Trainer(cfg, TrainConfig(b, t, logprob_chunk=16), loss, opt, mesh,
                 parallel.RULE_SETS["fsdp"])
    state, m = tr.step(tr.init_state(jax.random.key(0)), batch)
    results.append((jax.device_get(state.params), jax.device_get(m)))
  (p1, m1), (p2, m2) = results
  for k in ("loss", "designer_tokens", "agent_tokens", "grad_norm"):
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, err_msg=k)
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("opt", [
    OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0),  # params move by the raw gradient
    OptimizerConfig(),  # the reference AdamW recipe (lr 1e-6, clip 1.0)
])
def test_overflow_batches_make_one_update_equal_to_one_big_batch(opt):
  """12 sequences over 3 packed [2, 64] batches vs one per row in one [12, 64] batch."""
  rng = np.random.default_rng(1)
  lengths = [50, 45, 55, 40, 10, 8, 12, 6, 9, 14, 7, 11]
  rows = [Row(list(rng.integers(3, 259, n)), list(rng.random(n) < 0.7),
              list(rng.uniform(-6.5, -4.5, n)), float(rng.normal()),
              "designer" if i < 2 else "agent") for i, n in enumerate(lengths)]
  cfg = get_preset("tiny")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  results = []
  for b, pack in ((2, True), (12, False)):
    batches, stats = build_batches(rows, b, 64, pack=pack)
    assert stats["batch/rows"] == 12 and len(batches) == (3 if pack else 1)
    tr = Trainer(cfg, TrainConfig(b, 64, logprob_chunk=16), LossConfig(), opt, mesh,
                 parallel.RULE_SETS["fsdp"])
    state, m = tr.step(tr.init_state(jax.random.key(0)), batches)
    assert int(state.step) == 1  # one optimizer update for all batches
    results.append((jax.device_get(state.params), jax.device_get(m)))
  (p_multi, m_multi), (p_one, m_one) = results
  assert set(m_multi) == set(m_one)
  for k in ("token_count", "designer_tokens", "agent_tokens"):
    assert m_multi[k] == m_one[k], k
  for k, v in m_one.items():
    # tis_corr is a Pearson correlation from raw moments of log-probs near -5.5
    # (E[xy] - E[x]E[y] cancels ~30 - 30 in float32): summation order moves it
    # by ~1e-4 however the sums are split.
    tol = dict(rtol=0, atol=1e-3) if k == "tis_corr" else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m_multi[k], v, **tol, err_msg=k)
  for a, b in zip(jax.tree.leaves(p_multi), jax.tree.leaves(p_one)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def _plays(rng, prompts, per, role="agent", lo=4, hi=12, temperature=0.7):
  """`per` plays of each prompt: the prompt untrained, a sampled continuation trained."""
  rows = []
  for p in prompts:
    for _ in range(per):
      n = int(rng.integers(lo, hi))
      rows.append(Row(list(p) + list(rng.integers(3, 259, n)), [False] * len(p) + [True] * n,
                      [0.0] * len(p) + list(rng.uniform(-6, -4, n)), float(rng.normal()),
                      role, temperature))
  return rows


def test_shared_prompt_layout():
  """Three plays of one 6-token prompt: the prompt once, then each remainder from its last token."""
  p = [20, 21, 22, 23, 24, 25]
  rows = [Row(p + c, [False] * 6 + [True] * len(c), [0.0] * 6 + [-1.0] * len(c), a, "agent", 0.7)
          for c, a in (([30, 31], 1.0), ([40, 41, 42], -1.0), ([50], 0.5))]
  (out,), stats = build_batches(rows, 1, 32, share_prefix=4)
  # Prompt ids 0..4 once (segment -1), then [25, c...] per play (segments 2, 3, 4).
  np.testing.assert_array_equal(out["tokens"][0, :17], p[:5] + [25, 30, 31, 25, 40, 41, 42, 25, 50]
                                + [0] * 3)
  np.testing.assert_array_equal(out["segment_ids"][0, :15],
                                [-1] * 5 + [2] * 3 + [3] * 4 + [4] * 2 + [0])
  np.testing.assert_array_equal(out["prefix_ids"][0, :15], [0] * 5 + [-1] * 9 + [0])
  np.testing.assert_array_equal(out["positions"][0, :14],
                                [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 5, 6])
  np.testing.assert_array_equal(out["loss_mask"][0, :14], [False] * 6 + [True] * 2 + [False]
                                + [True] * 3 + [False, True])
  np.testing.assert_array_equal(out["advantages"][0, 5:14], [1.0] * 3 + [-1.0] * 4 + [0.5] * 2)
  assert stats["batch/shared_tokens"] == 10 and stats["batch/rows"] == 3
  assert stats["batch/loss_tokens"] == 6
  # Off, or prompts shorter than asked: every sequence whole.
  for share in (0, 6):
    (plain,), s = build_batches(rows, 1, 32, share_prefix=share)
    assert (plain["prefix_ids"] == 0).all() and s["batch/shared_tokens"] == 0
    assert (plain["segment_ids"] > 0).sum() == 24


def test_shared_prompts_only_join_what_fits_and_matches():
  rng = np.random.default_rng(3)
  a, b = list(rng.integers(3, 259, 20)), list(rng.integers(3, 259, 20))
  rows = _plays(rng, [a], 3) + _plays(rng, [b], 2)
  rows.append(Row(a + [7, 8], [False] * 22, [0.0] * 22, 0.0, "agent"))  # a's prompt, no run before
  (out,), stats = build_batches(rows, 4, 64, share_prefix=8)
  seg, pre = out["segment_ids"], out["prefix_ids"]
  # a's plays share, b's plays share, the last row follows b's: whole.
  assert sum(len(np.unique(r[r < 0])) for r in seg) == 2 and (seg < 0).sum() == 38
  assert stats["batch/shared_tokens"] == 19 * 2 + 19 * 1
  # A unit never crosses a row, and remainders only name a prompt in their own row.
  for r in range(4):
    names = set(pre[r][pre[r] != 0].tolist())
    assert names <= set(seg[r][seg[r] < 0].tolist())
  # Two groups whose questions begin alike (12 common tokens, past share_prefix): each
  # group's plays share their whole prompt, not the 12 tokens all eight would share.
  c = a[:12] + list(rng.integers(3, 259, 8))
  (out,), stats = build_batches(_plays(rng, [a], 4) + _plays(rng, [c], 4), 1, 256,
                                share_prefix=8)
  assert stats["batch/shared_tokens"] == 19 * 3 * 2
  seg = out["segment_ids"][0]
  assert np.unique(seg[seg < 0], return_counts=True)[1].tolist() == [19, 19]
  # A too-small row splits the plays into units that fit.
  batches, stats = build_batches(_plays(rng, [a], 6, lo=10, hi=11), 8, 64, share_prefix=8)
  assert all(((b["segment_ids"] != 0).sum(axis=1) <= 64).all() for b in batches)
  assert stats["batch/shared_tokens"] > 0 and stats["batch/rows_used"] == 2


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "dr_grpo"])
def test_shared_prompt_update_equals_whole_sequences(aggregation):
  """Plays packed with their prompt once give the update of the same plays laid out whole:
  per-token log-probs, loss, metrics and params."""
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(3, 259, n)) for n in (17, 23)]
  rows = _plays(rng, prompts[:1], 4, role="designer", temperature=1.0) + _plays(rng, prompts, 3)
  # A multi-turn play: trained turn, untrained observation, trained turn.
  rows.append(Row(prompts[1] + [5, 6, 7, 8, 9, 10], [False] * 23 + [True, True, False, False,
                                                                    True, True],
                  [0.0] * 23 + [-5.0] * 6, 0.3, "agent", 0.7))
  cfg = get_preset("tiny")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  loss = LossConfig(aggregation=aggregation, dr_grpo_norm=64)
  opt = OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0)
  results = []
  for b, share in ((11, 0), (2, 8)):
    # Whole: one per row, in order (so trained tokens flatten in the same order).
    (batch,), stats = build_batches(rows, b, 128, pack=bool(share), share_prefix=share)
    assert stats["batch/rows"] == 11
    if share:
      assert stats["batch/shared_tokens"] == 16 * 6 + 22 * 3  # designer + agent plays of a
    tr = Trainer(cfg, TrainConfig(b, 128, logprob_chunk=32, share_prefix=share), loss, opt,
                 mesh, parallel.RULE_SETS["fsdp"])
    logps = jax.device_get(tr._logps(tr.init_state(jax.random.key(0)).params,
                                     tr._put(batch)))
    state, m = tr.step(tr.init_state(jax.random.key(0)), batch)
    results.append((batch, logps, jax.device_get(state.params), jax.device_get(m)))
  (b1, l1, p1, m1), (b2, l2, p2, m2) = results
  # The trained tokens' log-probs, in order, are the same in both layouts.
  np.testing.assert_allclose(l2[b2["loss_mask"]], l1[b1["loss_mask"]], atol=2e-5)
  assert m1["token_count"] == m2["token_count"]
  for k in ("loss", "designer_tokens", "agent_tokens", "grad_norm", "agent_logp_gap_mean"):
    np.testing.assert_allclose(m2[k], m1[k], rtol=2e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=2e-6)


def test_width_bucket_cuts_padding_and_keeps_the_update():
  """Batches cut to the longest row rounded up to the bucket: padding columns only, the
  same update as the full width, one compiled step per width, and bad widths refused."""
  rng = np.random.default_rng(5)
  rows = _plays(rng, [list(rng.integers(3, 259, 12))], 5, lo=4, hi=9)
  rows += _plays(rng, [list(rng.integers(3, 259, 9))], 3, lo=3, hi=6)
  full, fstats = build_batches(rows, 2, 128, share_prefix=8)
  cut, cstats = build_batches(rows, 2, 128, share_prefix=8, width_bucket=16)
  used = max(int((full[0]["segment_ids"][r] != 0).sum()) for r in range(2))
  W = -(-used // 16) * 16
  assert cstats["batch/width"] == W < 128 and fstats["batch/width"] == 128
  for k in full[0]:
    np.testing.assert_array_equal(cut[0][k], full[0][k][:, :W], err_msg=k)
    assert (full[0]["segment_ids"][:, W:] == 0).all()
  assert cstats["batch/packing_efficiency"] == pytest.approx(
      fstats["batch/packing_efficiency"] * 128 / W)
  # A width in use that holds every row is taken over a new one; narrower ones are not.
  for seen, want in (([W - 16, W + 32, 128], W + 32), ([W - 16], W), ([256], W)):
    (again,), s = build_batches(rows, 2, 128, share_prefix=8, width_bucket=16, widths=seen)
    assert s["batch/width"] == again["tokens"].shape[1] == want, seen
  # Never wider than seq_len; an exact fit stays.
  (one,), s = build_batches(rows[:1], 1, len(rows[0].tokens), width_bucket=64)
  assert s["batch/width"] == len(rows[0].tokens) == one["tokens"].shape[1]
  cfg = get_preset("tiny")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  opt = OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0)
  out = []
  for batches, bucket in ((full, 0), (cut, 16)):
    tr = Trainer(cfg, TrainConfig(2, 128, logprob_chunk=32, width_bucket=bucket),
                 LossConfig(), opt, mesh, parallel.RULE_SETS["fsdp"])
    state, m = tr.step(tr.init_state(jax.random.key(0)), batches[0])
    out.append((jax.device_get(state.params), jax.device_get(m)))
    assert tr.widths == {batches[0]["tokens"].shape[1]}
  (p1, m1), (p2, m2) = out
  for k in ("loss", "grad_norm", "token_count"):
    np.testing.assert_allclose(m2[k], m1[k], rtol=2e-5, err_msg=k)
  for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=2e-6)
  # Wider than seq_len is refused, and so is any cut width without the setting.
  wide = {k: np.concatenate([v, v], axis=1) for k, v in full[0].items()}
  with pytest.raises(ValueError, match="or a width up to it"):
    tr.step(tr.init_state(jax.random.key(0)), wide)
  plain = Trainer(cfg, TrainConfig(2, 128, logprob_chunk=32), LossConfig(), opt, mesh,
                  parallel.RULE_SETS["fsdp"])
  with pytest.raises(ValueError, match=r"expected \(2, 128\)"):
    plain.step(plain.init_state(jax.random.key(0)), cut[0])
  with pytest.raises(ValueError, match="width_bucket"):
    TrainConfig(width_bucket=-1)
  with pytest.raises(ValueError, match="width_bucket"):
    build_batches([], 1, 8, width_bucket=-1)


def test_width_patience_compiles_a_narrower_width_once_it_has_paid_for_itself():
  """Rent or buy: a batch that a narrower new width would hold runs on the narrowest used
  width until the padding so spent reaches patience x seq_len x rows; then it takes the
  narrowest candidate that has paid, and the tally of what it settles starts again."""
  rng = np.random.default_rng(7)
  rows = _plays(rng, [list(rng.integers(3, 259, 10))], 3, lo=3, hi=5)
  (base,), s = build_batches(rows, 2, 128, width_bucket=16)
  need = int(s["batch/width"])
  assert s["batch/width_padding"] == 0 and need < 96
  waste: dict[int, int] = {}
  # Used width 128: each batch pays (128 - w) x 2 rows for every candidate w < 128.
  taken, used = [], {128}
  for _ in range(4):
    (b,), s = build_batches(rows, 2, 128, width_bucket=16, widths=sorted(used),
                            waste=waste, patience=0.25)
    taken.append(int(s["batch/width"]))
    used.add(taken[-1])  # as the trainer records the widths it stepped on
    assert b["tokens"].shape[1] == taken[-1]
    assert s["batch/width_padding"] == taken[-1] - need
  first = next(i for i in range(1, 5) if i * (128 - need) * 2 >= 0.25 * 128 * 2)
  assert taken[:first - 1] == [128] * (first - 1) and taken[first - 1] == need
  assert all(w == need for w in taken[first - 1:])  # need is in use now: no more waste
  assert not waste
  # Without a tally the used width is always reused; patience 0 compiles at once.
  (_,), s = build_batches(rows, 2, 128, width_bucket=16, widths=[128])
  assert s["batch/width"] == 128
  (_,), s = build_batches(rows, 2, 128, width_bucket=16, widths=[128], waste={}, patience=0)
  assert s["batch/width"] == need
  # A patience of 2 x seq_len: (2 x 128 x 2) / ((128 - need) x 2) batches at 128 first.
  waste = {}
  n = 0
  while True:
    (_,), s = build_batches(rows, 2, 128, width_bucket=16, widths=[128], waste=waste,
                            patience=2.0)
    n += 1
    if s["batch/width"] < 128:
      break
  assert n == -(-(2 * 128 * 2) // ((128 - need) * 2)) and s["batch/width"] == need
  with pytest.raises(ValueError, match="width_patience"):
    TrainConfig(width_patience=-1)


def test_share_prefix_must_not_be_negative():
  with pytest.raises(ValueError, match="share_prefix"):
    TrainConfig(share_prefix=-1)
  with pytest.raises(ValueError, match="share_prefix"):
    build_batches([], 1, 8, share_prefix=-1)


def test_resume_accepts_a_new_setting_at_its_default(tmp_path):
  """A workdir begun before `train.share_prefix` existed resumes while the rerun keeps the
  default; another value, or any other changed key, is refused."""
  import json  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.loop import check_config  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  old = {"seed": 0, "train": {"batch_size": 8}}
  (tmp_path / "config.json").write_text(json.dumps({"seed": 0, "train.batch_size": 8}))
  new = ml_collections.ConfigDict(old)
  new.train.share_prefix = TrainConfig().share_prefix
  check_config(new, epath.Path(tmp_path))  # the default: same run
  (tmp_path / "config.json").write_text(json.dumps({"seed": 0, "train.batch_size": 8}))
  new.train.share_prefix = 0
  with pytest.raises(ValueError, match="train.share_prefix"):
    check_config(new, epath.Path(tmp_path))
