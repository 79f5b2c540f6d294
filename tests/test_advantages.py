"""Advantage estimators against an independent NumPy model (plain loops)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.rl import advantages as adv_lib

NUM_GROUPS = 5
EPS = 1e-6

# Group 0: four rows, one invalid. Group 1: three rows, all valid.
# Group 2: a single valid row plus an invalid one (singleton). Group 3: all
# rows invalid. Group 4: no rows at all. One row with an out-of-range id.
REWARDS = np.array(
    [1.0, 0.0, 0.5, 7.0,   # g0 (7.0 invalid)
     0.2, 0.2, 0.8,        # g1
     0.9, -4.0,            # g2 (-4.0 invalid)
     3.0,                  # g3 (invalid)
     2.0],                 # id 9: out of range
    dtype=np.float32)
GROUP_IDS = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 9], dtype=np.int32)
VALID = np.array([1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1], dtype=bool)


def np_advantages(name, rewards, ids, valid, num_groups, eps=EPS):
  out = []
  for i, r in enumerate(rewards):
    if not valid[i] or not 0 <= ids[i] < num_groups:
      out.append(0.0)
      continue
    group = [float(rewards[j]) for j in range(len(rewards))
             if valid[j] and ids[j] == ids[i]]
    n = len(group)
    mean = sum(group) / n
    if name == "external":
      out.append(float(r))
    elif name == "dr_grpo":
      out.append(r - mean)
    elif n == 1:
      out.append(0.0)
    elif name == "grpo":
      std = math.sqrt(sum((g - mean) ** 2 for g in group) / n)
      out.append((r - mean) / (std + eps))
    elif name == "rloo":
      out.append(r - (sum(group) - r) / (n - 1))
  return np.array(out)


def test_golden_values_by_hand():
  # A few values written out, independent of the NumPy model above.
  g0 = np.array([1.0, 0.0, 0.5])
  std0 = math.sqrt(((0.5) ** 2 + (0.5) ** 2 + 0.0) / 3)
  got = {name: np.asarray(adv_lib.compute_advantages(
      name, jnp.asarray(REWARDS), jnp.asarray(GROUP_IDS), jnp.asarray(VALID),
      NUM_GROUPS)) for name in adv_lib.ADVANTAGE_ESTIMATORS}
  np.testing.assert_allclose(got["grpo"][:3], (g0 - 0.5) / (std0 + EPS), rtol=1e-5)
  np.testing.assert_allclose(got["dr_grpo"][4:7], [-0.2, -0.2, 0.4], atol=1e-6)
  np.testing.assert_allclose(got["rloo"][:3], [0.75, -0.75, 0.0], atol=1e-6)
  np.testing.assert_allclose(got["external"], REWARDS * VALID * (GROUP_IDS < 5))
  for name in ("grpo", "rloo", "dr_grpo"):
    assert got[name][7] == 0.0  # singleton group
  for name, a in got.items():
    assert np.all(a[~VALID] == 0.0), name
    assert a[10] == 0.0, name  # out-of-range id


@pytest.mark.parametrize("name", sorted(adv_lib.ADVANTAGE_ESTIMATORS))
def test_matches_numpy_under_jit(name):
  f = jax.jit(adv_lib.compute_advantages, static_argnames=("name", "num_groups"))
  got = f(name, jnp.asarray(REWARDS), jnp.asarray(GROUP_IDS),
          jnp.asarray(VALID), num_groups=NUM_GROUPS)
  want = np_advantages(name, REWARDS, GROUP_IDS, VALID, NUM_GROUPS)
  assert got.shape == REWARDS.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(adv_lib.ADVANTAGE_ESTIMATORS))
def test_random_groups_match_numpy(name):
  rng = np.random.default_rng(3)
  rewards = rng.normal(size=40).astype(np.float32)
  ids = rng.integers(0, 6, size=40).astype(np.int32)
  valid = rng.random(40) < 0.7
  got = adv_lib.compute_advantages(name, jnp.asarray(rewards), jnp.asarray(ids),
                                   jnp.asarray(valid), 6)
  want = np_advantages(name, rewards, ids, valid, 6)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_invalid_rows_may_hold_nan():
  rewards = REWARDS.copy()
  rewards[~VALID] = np.nan
  for name in adv_lib.ADVANTAGE_ESTIMATORS:
    got = adv_lib.compute_advantages(name, jnp.asarray(rewards),
                                     jnp.asarray(GROUP_IDS), jnp.asarray(VALID),
                                     NUM_GROUPS)
    want = np_advantages(name, REWARDS, GROUP_IDS, VALID, NUM_GROUPS)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_no_recompile_when_valid_mask_changes():
  traces = []

  @jax.jit
  def f(rewards, ids, valid):
    traces.append(1)
    return adv_lib.compute_advantages("grpo", rewards, ids, valid, NUM_GROUPS)

  r, g = jnp.asarray(REWARDS), jnp.asarray(GROUP_IDS)
  a = f(r, g, jnp.asarray(VALID))
  other = VALID.copy()
  other[[0, 4, 3]] = [False, False, True]
  b = f(r, g, jnp.asarray(other))
  assert len(traces) == 1
  np.testing.assert_allclose(
      b, np_advantages("grpo", REWARDS, GROUP_IDS, other, NUM_GROUPS),
      rtol=1e-5, atol=1e-6)
  assert not np.allclose(a, b)
  # The library entry point itself is cached across masks as well.
  before = adv_lib.compute_advantages._cache_size()
  # num_groups=11 is used by no other test, so exactly one entry is new.
  adv_lib.compute_advantages("rloo", r, g, jnp.asarray(VALID), 11)
  adv_lib.compute_advantages("rloo", r, g, jnp.asarray(other), 11)
  assert adv_lib.compute_advantages._cache_size() == before + 1


def test_unknown_name_raises_with_valid_names():
  with pytest.raises(ValueError, match=r"dr_grpo.*external.*grpo.*rloo"):
    adv_lib.ADVANTAGE_ESTIMATORS["ppo"]
  with pytest.raises(ValueError, match="grpo"):
    adv_lib.compute_advantages("ppo", jnp.zeros(3), jnp.zeros(3, jnp.int32),
                               jnp.ones(3, bool), 1)


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match=r"shape \[B\]"):
    adv_lib.compute_advantages("grpo", jnp.zeros(3), jnp.zeros(4, jnp.int32),
                               jnp.ones(3, bool), 2)
