"""Golden tests of the regret stage against an independent NumPy version of docs/METHOD.md §2.

`reference_rewards` below is written from docs/METHOD.md §2 alone (per env: Rh,
Rn0, w over the credit window, plateau, the five variants, per-skill trackers, centring on
the skill's mean in the cohort, scale = min(plays * regen_every, 50)); the buffer and
`compute_rewards` / `credit` must reproduce it on hand-made windows.
"""

import numpy as np
import pytest

from spade_jax.selfplay import buffer as buffer_lib
from spade_jax.selfplay import rewards as rw
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.rewards import RewardConfig, compute_rewards, credit, plateau

N, M, W, S = 20, 20, 4, 6  # 20 plays per arm: every multiple of 0.05 is an exact mean.


# --- the independent reference ---------------------------------------------------------

def np_plateau(w):
  d = max(0.4 - w, 0.0) + max(w - 0.6, 0.0)
  return 1.0 if d == 0 else max(0.0, 1.0 - d / 0.25)


def reference_rewards(envs, variant, *, plays, regen_every, invalid=-1.0, crash=-1.0):
  """Designer reward per env of one cohort, straight from docs/METHOD.md §2.

  Each env: {"skill", "kind" in played|invalid|failed, "hint": [Rh plays],
  "window": [[unhinted plays] per iteration], "timed_out"}. Returns {index: reward or None}.
  """
  g_fast, g_slow = 0.98, 0.85
  mu = {}
  for t in range(max(len(e.get("window", [])) for e in envs)):
    for s in sorted({e["skill"] for e in envs}):
      # Every counted play of the skill's programs: a failed play (the last one at
      # t = 1 of a "failed" env) does not count.
      plays_t = [r for e in envs if e["skill"] == s and e["kind"] != "invalid"
                 for r in (e["window"][t][:-1] if e["kind"] == "failed" and t == 1
                           else e["window"][t])]
      if not plays_t:
        continue
      r = float(np.mean(plays_t))
      slow = mu.get(s)
      mu[s] = r if slow is None else (1 - g_slow) * slow + g_slow * r
  del g_fast  # the fast tracker does not enter any variant's score
  raw = {}
  for i, e in enumerate(envs):
    if e["kind"] == "invalid":
      if invalid is not None:
        raw[i] = invalid
      continue
    if e["kind"] == "failed" and not (variant == "regret_based" and e.get("timed_out")):
      if crash is not None:
        raw[i] = crash
      continue
    window = [r for rs in e["window"] for r in rs]
    w = float(np.mean(window))
    rh, rn0 = float(np.mean(e["hint"])), float(np.mean(e["window"][0]))
    if variant == "blend":
      raw[i] = 0.4 * min(max((rh - rn0) / 0.15, 0.0), 1.0) + 0.6 * np_plateau(w)
    elif variant == "regret_based":
      raw[i] = -0.5 if e.get("timed_out") else max(0.0, rh - w)
    elif variant == "learning_potential":
      raw[i] = abs(w - mu[e["skill"]])
    elif variant == "micro_lp":
      half = len(e["window"]) // 2
      early = [r for rs in e["window"][:half] for r in rs]
      late = [r for rs in e["window"][half:] for r in rs]
      raw[i] = max(0.0, float(np.mean(late)) - float(np.mean(early))) if early else 0.0
    elif variant == "solve_rate":
      raw[i] = np_plateau(w)
  scale = min(plays * regen_every, 50)
  out = {}
  for i, v in raw.items():
    same = [raw[j] for j in raw if envs[j]["skill"] == envs[i]["skill"]]
    out[i] = (v - float(np.mean(same))) * scale
  return {i: out.get(i) for i in range(len(envs))}


# --- driving the buffer ------------------------------------------------------------------

def plays(rate, n):
  """n rewards in {0, 1} whose mean is exactly ``rate``."""
  k = int(round(rate * n))
  return [1.0] * k + [0.0] * (n - k)


def run_window(envs, cfg):
  """Records the envs' window into a fresh buffer and credits the cohort."""
  E = len(envs)
  buf = RegretBuffer.create(E, N, M, W, S)
  skill = np.array([e["skill"] if e["kind"] != "invalid" else -1 for e in envs], np.int32)
  valid = np.array([e["kind"] != "invalid" for e in envs])
  for t in range(W):
    r_n, m_n = np.zeros((E, N), np.float32), np.zeros((E, N), bool)
    r_h, m_h = np.zeros((E, M), np.float32), np.zeros((E, M), bool)
    failed, timed = np.zeros(E, bool), np.zeros(E, bool)
    for i, e in enumerate(envs):
      if e["kind"] == "invalid":
        continue
      r_n[i], m_n[i] = e["window"][t], True
      if t == 0:
        r_h[i], m_h[i] = e["hint"], True
      if e["kind"] == "failed" and t == 1:
        m_n[i, -1] = False  # the failed play does not count
        failed[i], timed[i] = True, bool(e.get("timed_out"))
    buf = buf.record(r_n, m_n, r_h, m_h, skill, valid, fresh=np.full(E, t == 0),
                     failed=failed, timed_out=timed)
  out = compute_rewards(buf, cfg)
  kinds = np.array([[{"played": rw.PLAYED, "invalid": rw.INVALID,
                      "failed": rw.FAILED}[e["kind"]]] for e in envs], np.int32)
  # One sample per slot, credited at the window's end: each reads its slot's raw score
  # and timeout flag (no slot was refilled meanwhile).
  values, use = credit(out.raw[:, None], kinds, np.array([e["skill"] for e in envs], np.int32),
                       out.stats.timed_out[:, None], cfg)
  return np.asarray(values)[:, 0], np.asarray(use)[:, 0], out


def env(skill, win, hint, kind="played", timed_out=False, window=None):
  w = window or [win] * W
  return {"skill": skill, "kind": kind, "timed_out": timed_out,
          "window": [plays(x, N) for x in w], "hint": plays(hint, M)}


COHORT = [
    env(0, 0.25, 0.50),                        # regret .25 clips to 1; plateau(.25) = .4
    env(0, 0.50, 0.65),                        # regret exactly .15: term 1
    env(0, 0.75, 0.50, window=[0.75, 0.7, 0.6, 0.85]),  # negative regret clips to 0
    env(1, 0.40, 0.45, window=[0.4, 0.6, 0.35, 0.85]),  # plateau edges inside the window
    env(1, 0.15, 0.30, window=[0.15, 0.15, 0.9, 0.9]),  # micro-LP rises
    env(2, 0.60, 0.95),                        # a singleton skill
    env(3, 0.50, 0.60, kind="failed"),         # crashed at t=1
    env(3, 0.30, 0.80, kind="failed", timed_out=True),
    env(3, 0.45, 0.55),
    env(4, 0.0, 0.0, kind="invalid"),          # failed validation
    env(4, 0.85, 0.90, window=[0.85, 0.9, 0.95, 1.0]),
]


@pytest.mark.parametrize("variant", sorted(rw.VARIANTS))
@pytest.mark.parametrize("penalties", [(-1.0, -1.0), (None, None), (0.5, None)])
def test_every_variant_matches_the_numpy_reference(variant, penalties):
  if variant.startswith("_"):
    pytest.skip("test-only variant")
  invalid, crash = penalties
  cfg = RewardConfig(variant=variant, credit_window=W, invalid_penalty=invalid,
                     crash_penalty=crash, scale=rw.reference_scale(N, W))
  got, use, _ = run_window(COHORT, cfg)
  want = reference_rewards(COHORT, variant, plays=N, regen_every=W, invalid=invalid,
                           crash=crash)
  for i, w in want.items():
    assert use[i] == (w is not None), (i, variant)
    if w is not None:
      np.testing.assert_allclose(got[i], w, atol=2e-4, err_msg=f"env {i} {variant}")


def test_scale_rule_and_singleton_skill():
  assert rw.reference_scale(8, 4) == 32.0  # the games recipe: 192 / 24 * 4
  assert rw.reference_scale(16, 32) == 50.0 and rw.reference_scale(8, 8) == 50.0
  cfg = RewardConfig(credit_window=W, scale=32.0)
  got, use, _ = run_window([env(2, 0.5, 0.9)], cfg)
  assert use[0] and got[0] == 0.0  # centred on a cohort of one


def test_all_invalid_cohort_pushes_nothing():
  cfg = RewardConfig(credit_window=W, scale=32.0)
  got, use, _ = run_window([env(0, 0, 0, kind="invalid")] * 3, cfg)
  assert use.all() and np.all(got == 0.0)


@pytest.mark.parametrize("crash", [-1.0, None])
def test_credit_scores_each_sample_by_its_own_raw_and_failure(crash):
  # Slot 0: an invalid first attempt, then a program that timed out mid-window (its slot
  # was refilled since, so it carries its own raw score -0.5 and flag). Slot 1: a played
  # program (raw 0.3) and, as a second attempt, one that crashed with raw 0.9 at the time.
  # Slot 2: a played program of another skill. Slot 3: nothing.
  kinds = np.array([[rw.INVALID, rw.FAILED], [rw.PLAYED, rw.FAILED], [rw.PLAYED, rw.NONE],
                    [rw.NONE, rw.NONE]], np.int32)
  raw = np.array([[0.0, -0.5], [0.3, 0.9], [0.7, 0.0], [0.0, 0.0]], np.float32)
  timed_out = np.array([[False, True], [False, False], [False, False], [False, False]])
  skill = np.array([0, 0, 1, 0], np.int32)

  def run(variant):
    cfg = RewardConfig(variant=variant, scale=32.0, crash_penalty=crash)
    values, use = credit(raw, kinds, skill, timed_out, cfg)
    return np.asarray(values), np.asarray(use)

  values, use = run("regret_based")
  # Skill 0's cohort: invalid -1, timeout -0.5 (its own), played 0.3, crash (penalty or
  # no gradient); skill 1 is a cohort of one.
  scored = {(0, 0): -1.0, (0, 1): -0.5, (1, 0): 0.3}
  if crash is not None:
    scored[1, 1] = crash
  mean = np.mean(list(scored.values()))
  want = np.zeros((4, 2), np.float32)
  for ea, v in scored.items():
    want[ea] = (v - mean) * 32.0
  np.testing.assert_allclose(values, want, atol=1e-4)
  np.testing.assert_array_equal(use, np.isin(np.arange(8), [0, 1, 2, 4]
                                             + ([3] if crash is not None else [])).reshape(4, 2))
  # Other variants do not score timeouts: the timed-out sample is a crash like any other.
  values, use = run("blend")
  assert use[0, 1] == (crash is not None) and use[2, 0] and not use[2, 1]
  if crash is not None:
    mean = np.mean([-1.0, crash, 0.3, crash])
    np.testing.assert_allclose(values[0, 1], (crash - mean) * 32.0, atol=1e-4)
  with pytest.raises(ValueError, match=r"raw has shape \(4,\); it is per sample"):
    credit(raw[:, 0], kinds, skill, timed_out, RewardConfig(scale=1.0))


def test_plateau_edges():
  w = np.array([0.0, 0.15, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 0.9, 1.0], np.float32)
  want = [np_plateau(float(x)) for x in w]
  np.testing.assert_allclose(plateau(w, 0.4, 0.6, 0.25), want, atol=1e-6)
  np.testing.assert_allclose(plateau(np.float32(0.35), 0.4, 0.6, 0.25), 0.8, atol=1e-6)


def test_window_statistics():
  cfg = RewardConfig(credit_window=W, scale=1.0)
  _, _, out = run_window([env(0, 0.5, 0.75, window=[0.5, 0.25, 0.75, 1.0])], cfg)
  s = out.stats
  np.testing.assert_allclose([s.w[0], s.rh[0], s.rn0[0], s.early[0], s.late[0]],
                             [0.625, 0.75, 0.5, 0.375, 0.875], atol=1e-6)
  # win rate = fraction of plays with reward > 0
  np.testing.assert_allclose(s.win_rate[0], 0.625, atol=1e-6)


def test_band_share_counts_played_envs_with_win_rate_in_the_band():
  cfg = RewardConfig(credit_window=1, scale=1.0)
  cohort = [env(0, 0.5, 0.5), env(0, 0.25, 0.5), env(1, 0.75, 0.9), env(1, 0.0, 0.0, "invalid")]
  _, _, out = run_window(cohort, cfg)
  # win rates .5 (in), .25 and .75 (out); the invalid slot never played and does not count.
  assert float(out.metrics["win_rate_band_frac"]) == pytest.approx(1 / 3)


def test_agent_advantages_group_zscore():
  buf = RegretBuffer.create(3, 4, 2, 2, 1)
  r = np.array([[1, 0, 0, 0], [1, 1, 0, 7], [1, 0, 1, 0]], np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
  buf = buf.record(r, mask, np.zeros((3, 2)), np.ones((3, 2), bool), [0, 0, 0],
                   [True, True, False], fresh=np.ones(3, bool))
  adv = compute_rewards(buf, RewardConfig()).agent_advantages
  s0 = np.sqrt(0.25 * 0.75)
  np.testing.assert_allclose(adv[0], [0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0],
                             atol=1e-4)
  s1 = np.sqrt(2 / 9)  # plays 1, 1, 0 (the 7 is masked out)
  np.testing.assert_allclose(adv[1], [1 / 3 / s1, 1 / 3 / s1, -2 / 3 / s1, 0.0], atol=1e-4)
  np.testing.assert_allclose(adv[2], 0.0)  # invalid env
  adv = compute_rewards(buf, RewardConfig(advantage="dr_grpo")).agent_advantages
  np.testing.assert_allclose(adv[0], [0.75, -0.25, -0.25, -0.25], atol=1e-6)


def test_changing_valid_count_never_recompiles():
  traces = []

  def counting(stats, cfg):
    traces.append(1)  # runs only while tracing
    return rw.VARIANTS["blend"](stats, cfg)

  name = "_test_counting_blend"
  if name not in rw.VARIANTS:
    rw.VARIANTS.register(name)(counting)
  cfg = RewardConfig(variant=name, scale=1.0)
  e = 8
  buf = RegretBuffer.create(e, 4, 4, 4, 3)
  rng = np.random.default_rng(0)
  sizes = []
  for it, n_valid in enumerate([e, 0, 3, 1, 7, 5]):
    valid = np.arange(e) < n_valid
    buf = buf.record(rng.integers(0, 2, (e, 4)).astype(np.float32), rng.random((e, 4)) < 0.8,
                     rng.integers(0, 2, (e, 4)).astype(np.float32), np.ones((e, 4), bool),
                     rng.integers(0, 3, e), valid, fresh=np.full(e, it % 2 == 0))
    out = compute_rewards(buf, cfg)
    credit(out.raw[:, None], np.where(valid, rw.PLAYED, rw.INVALID)[:, None].astype(np.int32),
           rng.integers(0, 3, e).astype(np.int32), out.stats.timed_out[:, None], cfg)
    sizes.append(buffer_lib._record._cache_size())  # pylint: disable=protected-access
  assert len(traces) == 1 and len(set(sizes)) == 1


def test_bad_config_and_shapes_name_the_problem():
  with pytest.raises(ValueError, match="Unknown designer reward variant.*rewards.variant"):
    RewardConfig(variant="regrett")
  with pytest.raises(ValueError, match="ema_slow"):
    RewardConfig(ema_slow=0.0)
  buf = RegretBuffer.create(2, 4, 4, 2)
  with pytest.raises(ValueError, match=r"rewards_nohint has shape \(2, 3\); expected \(2, 4\)"):
    buf.record(np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 4)),
               np.ones((2, 4), bool), [0, 0], [True, True])


def test_a_skill_with_one_slot_centres_its_designs_to_zero():
  # What `stages.design.lone_skill_warning` warns of: two slots of skill 0 keep their
  # difference; skill 1's only slot is centred on itself, whatever its raw score.
  cfg = RewardConfig(variant="blend", scale=32.0)
  raw = np.array([[0.9], [0.1], [0.7]], np.float32)
  kinds = np.full((3, 1), rw.PLAYED, np.int32)
  values, use = credit(raw, kinds, np.array([0, 0, 1], np.int32), np.zeros((3, 1), bool),
                       cfg)
  assert np.asarray(use).all()
  np.testing.assert_allclose(np.asarray(values)[:, 0], [12.8, -12.8, 0.0], atol=1e-5)
