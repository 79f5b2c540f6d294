"""Golden tests for the regret buffer and designer rewards.

Expected numbers are worked out by hand in the comments next to each case.
"""

import numpy as np
import pytest

from spade_jax.selfplay import buffer as buffer_lib
from spade_jax.selfplay import rewards as rw
from spade_jax.selfplay.rewards import RewardConfig, compute_rewards, plateau
from spade_jax.selfplay.buffer import RegretBuffer

N = M = 20  # 20 plays per arm: every multiple of 0.05 is an exact win rate.


def rows(rates, n):
  """bool-free float rows whose means are exactly ``rates`` (k ones then zeros)."""
  out = np.zeros((len(rates), n), np.float32)
  for i, r in enumerate(rates):
    out[i, :int(round(r * n))] = 1.0
  return out


def step(buf, win, hint, skill=None, valid=None, fresh=None, played=None):
  e = len(win)
  skill = np.zeros(e, np.int32) if skill is None else np.asarray(skill)
  valid = np.ones(e, bool) if valid is None else np.asarray(valid)
  played = np.ones(e, bool) if played is None else np.asarray(played)
  mask_n = np.repeat(played[:, None], buf.num_plays, 1)
  mask_h = np.repeat(played[:, None], buf.num_hinted, 1)
  return buf.record(rows(win, buf.num_plays), mask_n, rows(hint, buf.num_hinted), mask_h,
                    skill, valid, fresh)


def designer_rewards(buf, cfg):
  out = compute_rewards(buf, cfg)
  return out.designer, out.metrics


def raw_cfg(**kw):
  return RewardConfig(center_by_skill=False, **kw)


def test_plateau_edges():
  w = np.array([0.0, 0.15, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 0.9, 1.0], np.float32)
  # Inside [0.4, 0.6] -> 1; at distance d outside -> max(0, 1 - d / 0.25).
  want = [0.0, 0.0, 0.6, 1.0, 1.0, 1.0, 0.6, 0.0, 0.0, 0.0]
  np.testing.assert_allclose(plateau(w, 0.4, 0.6, 0.25), want, atol=1e-6)
  # Just outside the band: d = 0.05 -> 0.8.
  np.testing.assert_allclose(plateau(np.float32(0.35), 0.4, 0.6, 0.25), 0.8, atol=1e-6)


def test_blend_golden_including_regret_clip():
  buf = RegretBuffer.create(7, N, M, 4)
  win = [0.25, 0.50, 0.50, 0.50, 0.75, 1.00, 0.40]
  hint = [0.50, 0.50, 0.65, 0.55, 0.50, 1.00, 0.70]
  buf = step(buf, win, hint, fresh=np.ones(7, bool))
  rewards, metrics = designer_rewards(buf, raw_cfg())
  want = [
      0.4 * 1.0 + 0.6 * 0.4,  # regret .25 clips to 1; plateau(.25) = 1 - .15/.25 = .4
      0.0 + 0.6 * 1.0,  # regret 0; w in band
      0.4 * 1.0 + 0.6,  # regret exactly 0.15 -> term 1.0
      0.4 * (0.05 / 0.15) + 0.6,  # regret .05 -> 1/3
      0.0 + 0.6 * 0.4,  # negative regret clips to 0; plateau(.75) = .4
      0.0 + 0.0,  # solved always: plateau(1.0) = 0
      0.4 * 1.0 + 0.6 * 1.0,  # lower band edge w = 0.4; regret .3 clips to 1
  ]
  np.testing.assert_allclose(rewards, want, atol=1e-5)
  np.testing.assert_allclose(metrics["per_env/regret"],
                             [0.25, 0, 0.15, 0.05, -0.25, 0, 0.3], atol=1e-6)
  np.testing.assert_allclose(metrics["per_env/win_rate"], win, atol=1e-6)


def test_regret_and_solve_rate_variants():
  buf = step(RegretBuffer.create(3, N, M, 4), [0.25, 0.6, 0.9], [0.5, 0.6, 0.8],
             fresh=np.ones(3, bool))
  r, _ = designer_rewards(buf, raw_cfg(variant="regret"))
  np.testing.assert_allclose(r, [0.25, 0.0, -0.1], atol=1e-6)
  r, _ = designer_rewards(buf, raw_cfg(variant="solve_rate"))
  np.testing.assert_allclose(r, [0.4, 1.0, 0.0], atol=1e-6)  # upper edge .6 -> 1; .9 -> 0


def test_learning_potential_variants_follow_emas():
  buf = RegretBuffer.create(1, N, M, 4)
  buf = step(buf, [0.0], [0.5], fresh=[True])
  buf = step(buf, [0.5], [0.5])
  buf = step(buf, [1.0], [1.0])
  # EMAs start at the first win rate (0), then ema <- g * ema + (1 - g) * w:
  #   slow (g=.98): 0 -> .01 -> .98 * .01 + .02 * 1 = .0298
  #   fast (g=.85): 0 -> .075 -> .85 * .075 + .15 * 1 = .21375
  np.testing.assert_allclose(buf.ema_slow, [0.0298], atol=1e-6)
  np.testing.assert_allclose(buf.ema_fast, [0.21375], atol=1e-6)
  r, _ = designer_rewards(buf, raw_cfg(variant="learning_potential"))
  np.testing.assert_allclose(r, [abs(0.5 - 0.0298)], atol=1e-6)  # w = mean(0, .5, 1)
  r, _ = designer_rewards(buf, raw_cfg(variant="micro_learning_potential"))
  np.testing.assert_allclose(r, [0.21375 - 0.0298], atol=1e-6)


def test_skill_centring_scaling_and_invalid_penalty():
  # w -> plateau: .5 -> 1, .25 -> .4, .5 -> 1, 1.0 -> 0; env 4 (skill 0) is invalid.
  buf = step(RegretBuffer.create(5, N, M, 4), [0.5, 0.25, 0.5, 1.0, 0.5],
             [0.5, 0.25, 0.5, 1.0, 0.5], skill=[0, 0, 1, 1, 0],
             valid=[True, True, True, True, False], fresh=np.ones(5, bool))
  cfg = RewardConfig(variant="solve_rate", invalid_penalty=-0.5)
  r, m = designer_rewards(buf, cfg)
  # skill 0 mean over valid = (1 + .4) / 2 = .7; skill 1 mean = .5.
  np.testing.assert_allclose(r, [0.3, -0.3, 0.5, -0.5, -0.5], atol=1e-6)
  np.testing.assert_allclose(m["per_env/skill_mean"][:4], [0.7, 0.7, 0.5, 0.5], atol=1e-6)
  r, _ = designer_rewards(buf, RewardConfig(variant="solve_rate", scale=2.0,
                                            invalid_penalty=0.0))
  np.testing.assert_allclose(r, [0.6, -0.6, 1.0, -1.0, 0.0], atol=1e-6)
  # Per-skill std: .3 for skill 0, .5 for skill 1 -> +-1.
  r, _ = designer_rewards(buf, RewardConfig(variant="solve_rate", normalize_by_skill_std=True))
  np.testing.assert_allclose(r, [1.0, -1.0, 1.0, -1.0, -1.0], atol=1e-4)
  np.testing.assert_allclose(m["valid_frac"], 0.8, atol=1e-6)


def test_delayed_credit_window_and_fresh_slots():
  buf = RegretBuffer.create(2, N, M, 4)
  buf = step(buf, [0.0, 1.0], [0.5, 1.0], fresh=[True, True])
  buf = step(buf, [0.5, 1.0], [0.5, 1.0])
  buf = step(buf, [1.0, 0.5], [1.0, 0.75], fresh=[False, True])  # slot 1: new program
  # Window 2, slot 0: iterations 2-3 -> w = .75, regret 0 -> .6 * plateau(.75) = .24.
  # Slot 1 restarted at iteration 3 -> w = .5, regret .25 -> .4 + .6 = 1.0.
  r, m = designer_rewards(buf, raw_cfg(credit_window=2))
  np.testing.assert_allclose(r, [0.24, 1.0], atol=1e-6)
  # Window 4, slot 0: iterations 1-3 -> w = .5, regret (.5 + 0 + 0) / 3 -> clip 1 -> 1.0.
  r, m = designer_rewards(buf, raw_cfg(credit_window=4))
  np.testing.assert_allclose(r, [1.0, 1.0], atol=1e-6)
  np.testing.assert_allclose(m["per_env/regret"], [0.5 / 3, 0.25], atol=1e-6)


def test_ring_wraps_and_skips_unplayed_iterations():
  buf = RegretBuffer.create(1, N, M, 2)  # W = 2 < iterations recorded.
  buf = step(buf, [0.0], [0.0], fresh=[True])
  buf = step(buf, [0.2], [0.4])
  buf = step(buf, [0.9], [0.9], played=[False])  # No plays: ring entry not counted.
  buf = step(buf, [0.6], [0.6])
  # Window 2 covers the last two ring rows: the unplayed one and w = .6 -> only .6 counts.
  r, m = designer_rewards(buf, raw_cfg(variant="solve_rate", credit_window=2))
  np.testing.assert_allclose(m["per_env/win_rate"], [0.6], atol=1e-6)
  np.testing.assert_allclose(r, [1.0], atol=1e-6)
  assert int(buf.iteration) == 4 and int(buf.head) == 0
  # EMA skips the unplayed iteration: slow 0 -> .004 -> .98 * .004 + .02 * .6 = .01592.
  np.testing.assert_allclose(buf.ema_slow, [0.01592], atol=1e-6)


def test_valid_env_without_plays_gets_zero_and_no_skill_weight():
  buf = step(RegretBuffer.create(3, N, M, 4), [0.5, 0.25, 0.0], [0.5, 0.25, 0.0],
             played=[True, True, False], fresh=np.ones(3, bool))
  r, m = designer_rewards(buf, RewardConfig(variant="solve_rate"))
  np.testing.assert_allclose(r, [0.3, -0.3, 0.0], atol=1e-6)
  np.testing.assert_allclose(m["credited_frac"], 2 / 3, atol=1e-6)


def test_agent_advantages_group_zscore():
  buf = RegretBuffer.create(3, 4, 2, 2)
  r = np.array([[1, 0, 0, 0], [1, 1, 0, 7], [1, 0, 1, 0]], np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
  buf = buf.record(r, mask, np.zeros((3, 2)), np.ones((3, 2), bool), [0, 0, 0],
                   [True, True, False], fresh=np.ones(3, bool))
  adv = compute_rewards(buf, RewardConfig()).agent_advantages
  # Env 0: mean .25, std sqrt(.25 * .75) = .4330127.
  s0 = np.sqrt(0.25 * 0.75)
  np.testing.assert_allclose(adv[0], [0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0],
                             atol=1e-4)
  # Env 1: plays 1, 1, 0 (the 7 is masked out): mean 2/3, std sqrt(2/9).
  s1 = np.sqrt(2 / 9)
  np.testing.assert_allclose(adv[1], [1 / 3 / s1, 1 / 3 / s1, -2 / 3 / s1, 0.0], atol=1e-4)
  np.testing.assert_allclose(adv[2], 0.0)  # Invalid env.
  adv = compute_rewards(buf, RewardConfig(advantage="dr_grpo")).agent_advantages
  np.testing.assert_allclose(adv[0], [0.75, -0.25, -0.25, -0.25], atol=1e-6)


def test_changing_valid_count_never_recompiles():
  traces = []

  def counting(stats, cfg):
    traces.append(1)  # Runs only while tracing.
    return rw.VARIANTS["blend"](stats, cfg)

  name = "_test_counting_blend"
  if name not in rw.VARIANTS:
    rw.VARIANTS.register(name)(counting)
  cfg = RewardConfig(variant=name)
  e = 8
  buf = RegretBuffer.create(e, 4, 4, 4)
  rng = np.random.default_rng(0)
  record_sizes = []
  for it, n_valid in enumerate([e, 0, 3, 1, 7, 5]):
    valid = np.arange(e) < n_valid
    buf = buf.record(rng.integers(0, 2, (e, 4)).astype(np.float32), rng.random((e, 4)) < 0.8,
                     rng.integers(0, 2, (e, 4)).astype(np.float32), np.ones((e, 4), bool),
                     rng.integers(0, 3, e), valid, fresh=np.full(e, it % 2 == 0))
    r, _ = designer_rewards(buf, cfg)
    np.testing.assert_array_equal(np.asarray(r)[~valid], -1.0)
    record_sizes.append(buffer_lib._record._cache_size())  # pylint: disable=protected-access
  assert len(traces) == 1
  assert len(set(record_sizes)) == 1


def test_unknown_variant_lists_valid_names():
  with pytest.raises(ValueError, match="blend.*solve_rate|Unknown designer reward variant"):
    RewardConfig(variant="regrett")
  with pytest.raises(ValueError) as info:
    rw.VARIANTS["nope"]
  for name in ("blend", "regret", "learning_potential", "solve_rate",
               "micro_learning_potential"):
    assert name in str(info.value)


def test_config_from_plain_dict_and_bad_shapes():
  cfg = RewardConfig(**{"variant": "solve_rate", "credit_window": 2, "invalid_penalty": 0.0})
  assert cfg.variant == "solve_rate" and hash(cfg) == hash(RewardConfig(**vars(cfg)))
  buf = RegretBuffer.create(2, 4, 4, 2)
  with pytest.raises(ValueError, match=r"rewards_nohint has shape \(2, 3\); expected \(2, 4\)"):
    buf.record(np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 4)),
               np.ones((2, 4), bool), [0, 0], [True, True])
