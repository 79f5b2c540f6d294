"""GRPO batch layout: first-fit packing, segments, positions, per-token fields."""

import jax
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer
from spade_jax.selfplay.batch import Row, build_batch, first_fit


def _row(n, adv=0.5, role="agent", start=10):
  return Row(list(range(start, start + n)), [i % 3 != 0 for i in range(n)],
             [-0.1 * i for i in range(n)], adv, role)


def test_first_fit_decreasing():
  assert first_fit([3, 5, 4, 2], num_bins=2, capacity=8) == [0, 0, 1, 1]
  assert first_fit([9, 2], num_bins=3, capacity=8) == [-1, 0]


def test_packed_layout():
  rows = [_row(5, 1.0, "designer"), _row(7, -2.0), _row(3, 0.25), _row(6, 3.0)]
  out, stats = build_batch(rows, batch_size=3, seq_len=8, pad_id=0)
  assert all(v.shape == (3, 8) for v in out.values())
  # Longest first: 7 -> row 0, 6 -> row 1, 5 -> row 2, 3 -> row 2 after the 5.
  np.testing.assert_array_equal(out["segment_ids"], [[1] * 7 + [0], [1] * 6 + [0, 0],
                                                     [1] * 5 + [2] * 3])
  np.testing.assert_array_equal(out["positions"][2], [0, 1, 2, 3, 4, 0, 1, 2])
  np.testing.assert_array_equal(out["tokens"][2], [10, 11, 12, 13, 14, 10, 11, 12])
  np.testing.assert_array_equal(out["advantages"][2], [1.0] * 5 + [0.25] * 3)
  np.testing.assert_array_equal(out["role"][2], [0] * 5 + [1] * 3)
  np.testing.assert_allclose(out["old_logps"][2, 5:], [0.0, -0.1, -0.2], atol=1e-7)
  # Segment starts are never trained on; padding never is.
  assert not out["loss_mask"][2, 0] and not out["loss_mask"][2, 5]
  np.testing.assert_array_equal(out["loss_mask"][2, 5:], [False, True, True])
  assert not out["loss_mask"][out["segment_ids"] == 0].any()
  assert stats["batch/rows"] == 4 and stats["batch/dropped_rows"] == 0
  assert stats["batch/rows_used"] == 3 and stats["batch/designer_rows"] == 1
  assert stats["batch/packing_efficiency"] == pytest.approx(21 / 24)
  assert stats["batch/loss_tokens"] == out["loss_mask"].sum()


def test_unpacked_layout_cut_and_dropped():
  rows = [_row(5), _row(12), _row(3)]
  out, stats = build_batch(rows, batch_size=2, seq_len=8, pack=False)
  np.testing.assert_array_equal(out["segment_ids"].max(axis=1), [1, 1])
  assert stats["batch/cut_tokens"] == 4 and stats["batch/dropped_rows"] == 1
  packed, pstats = build_batch(rows, batch_size=2, seq_len=8)
  assert pstats["batch/dropped_rows"] == 0  # 5 + 3 share a row
  assert pstats["batch/packing_efficiency"] == 1.0


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
    batch, stats = build_batch(rows, b, t, pack=pack)
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
