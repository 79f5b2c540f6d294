"""Regret buffer: fixed-shape play results, per-program statistics and a short history ring.

Shapes are set once by :meth:`RegretBuffer.create` (``E`` env slots, ``N`` unhinted plays,
``M`` hinted plays, ``W`` history iterations, ``S`` skills) and never change, so every jitted
consumer compiles once no matter how many envs were valid or played in a round.

An env slot holds one program for several iterations (regenerated every few iterations).
Each :meth:`RegretBuffer.record` stores one iteration's results for all slots:

* a slot marked ``fresh`` starts a new program: its age and failure flags restart, and the
  iteration's hinted and unhinted means become its regeneration-step statistics ``Rh`` and
  ``Rn0`` (hinted plays happen only at the regeneration step, as in the reference);
* the ring gets each slot's unhinted reward sum, play count and win count (plays with
  reward > 0), from which :mod:`spade_jax.selfplay.rewards` averages over the credit window;
* one learning-potential tracker per skill advances with that skill's mean unhinted reward:
  ``mu <- (1 - g) * mu + g * r`` (``g`` weights the new value; reference ``g_fast = 0.98``,
  ``g_slow = 0.85``); a tracker starts at its skill's first observed value.

Typical order in one iteration::

  buf = buf.record(r_nohint, m_nohint, r_hint, m_hint, skill, valid, fresh=new_programs,
                   failed=crashed, timed_out=timed_out)
  out = compute_rewards(buf, reward_cfg)
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class RegretBuffer:
  """Play results of the current iteration, per-program statistics and a history ring.

  Attributes:
    rewards_nohint: f32[E, N] unhinted play rewards (current iteration).
    mask_nohint: bool[E, N] which unhinted plays count (happened, not a sandbox failure).
    rewards_hint: f32[E, M] hinted play rewards (same seeds as the unhinted plays).
    mask_hint: bool[E, M] which hinted plays count.
    skill: i32[E] skill index of each slot's program (-1: not a designer program).
    valid: bool[E] whether each slot holds a valid program.
    age: i32[E] iterations recorded since the slot's program was installed.
    hint_mean: f32[E] ``Rh``, mean hinted reward at the program's regeneration step.
    nohint0_mean: f32[E] ``Rn0``, mean unhinted reward at the regeneration step.
    has_hint: bool[E] hinted plays counted at the regeneration step.
    hint_win_rate: f32[E] fraction of those hinted plays with reward > 0.
    failed: bool[E] some play of the program ended in a sandbox failure.
    timed_out: bool[E] some play of the program ended in a timeout.
    hist_sum: f32[W, E] ring of per-slot sums of unhinted rewards.
    hist_count: f32[W, E] ring of per-slot counts of unhinted plays.
    hist_wins: f32[W, E] ring of per-slot counts of unhinted plays with reward > 0.
    skill_fast: f32[S] fast learning-potential tracker per skill.
    skill_slow: f32[S] slow learning-potential tracker per skill.
    skill_seen: bool[S] whether each tracker has a value yet.
    head: i32[] ring index the next record writes to.
    iteration: i32[] number of records so far.
  """
  rewards_nohint: jax.Array
  mask_nohint: jax.Array
  rewards_hint: jax.Array
  mask_hint: jax.Array
  skill: jax.Array
  valid: jax.Array
  age: jax.Array
  hint_mean: jax.Array
  nohint0_mean: jax.Array
  has_hint: jax.Array
  hint_win_rate: jax.Array
  failed: jax.Array
  timed_out: jax.Array
  hist_sum: jax.Array
  hist_count: jax.Array
  hist_wins: jax.Array
  skill_fast: jax.Array
  skill_slow: jax.Array
  skill_seen: jax.Array
  head: jax.Array
  iteration: jax.Array

  @classmethod
  def create(cls, num_envs: int, num_plays: int, num_hinted: int, window: int = 4,
             num_skills: int = 6) -> RegretBuffer:
    """An empty buffer.

    Args:
      num_envs: E, env slots per iteration.
      num_plays: N, unhinted plays per env.
      num_hinted: M, hinted plays per env.
      window: W, iterations of history kept (>= the reward config's credit window).
      num_skills: S, skills of the setting (one learning-potential tracker each).

    Returns:
      A buffer with every slot invalid and an empty history.
    """
    for name, v in (("num_envs", num_envs), ("num_plays", num_plays),
                    ("num_hinted", num_hinted), ("window", window), ("num_skills", num_skills)):
      if int(v) < 1:
        raise ValueError(f"RegretBuffer.create needs {name} >= 1; got {v}.")
    e, n, m, w, s = map(int, (num_envs, num_plays, num_hinted, window, num_skills))
    f32 = jnp.float32
    zeros = lambda *shape, dtype=f32: jnp.zeros(shape, dtype)  # pylint: disable=unnecessary-lambda-assignment
    return cls(
        rewards_nohint=zeros(e, n), mask_nohint=zeros(e, n, dtype=bool),
        rewards_hint=zeros(e, m), mask_hint=zeros(e, m, dtype=bool),
        skill=jnp.full((e,), -1, jnp.int32), valid=zeros(e, dtype=bool),
        age=zeros(e, dtype=jnp.int32), hint_mean=zeros(e), nohint0_mean=zeros(e),
        has_hint=zeros(e, dtype=bool), hint_win_rate=zeros(e), failed=zeros(e, dtype=bool),
        timed_out=zeros(e, dtype=bool),
        hist_sum=zeros(w, e), hist_count=zeros(w, e), hist_wins=zeros(w, e),
        skill_fast=zeros(s), skill_slow=zeros(s), skill_seen=zeros(s, dtype=bool),
        head=jnp.zeros((), jnp.int32), iteration=jnp.zeros((), jnp.int32))

  @property
  def num_envs(self) -> int:
    return self.rewards_nohint.shape[0]

  @property
  def num_plays(self) -> int:
    return self.rewards_nohint.shape[1]

  @property
  def num_hinted(self) -> int:
    return self.rewards_hint.shape[1]

  @property
  def window(self) -> int:
    return self.hist_sum.shape[0]

  @property
  def num_skills(self) -> int:
    return self.skill_fast.shape[0]

  def record(self, rewards_nohint, mask_nohint, rewards_hint, mask_hint, skill, valid,
             fresh=None, failed=None, timed_out=None, *, ema_fast: float = 0.98,
             ema_slow: float = 0.85) -> RegretBuffer:
    """Stores one iteration's results; see :func:`record`."""
    return record(self, rewards_nohint, mask_nohint, rewards_hint, mask_hint, skill, valid,
                  fresh, failed, timed_out, ema_fast=ema_fast, ema_slow=ema_slow)

  def window_mask(self, credit_window: int) -> jax.Array:
    """bool[W, E]: ring entries inside each slot's credit window; see :func:`window_mask`."""
    return window_mask(self, credit_window)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int = -1) -> jax.Array:
  """Mean of ``x`` over ``axis`` where ``mask``; 0 where nothing is masked in."""
  m = mask.astype(x.dtype)
  return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def _check_shape(name: str, x: jax.Array, shape: tuple[int, ...]) -> None:
  if tuple(x.shape) != shape:
    raise ValueError(f"RegretBuffer.record: {name} has shape {tuple(x.shape)}; expected "
                     f"{shape} (the shapes given to RegretBuffer.create). Pad to the fixed "
                     "shape and mask the unused entries.")


def record(buf: RegretBuffer, rewards_nohint, mask_nohint, rewards_hint, mask_hint, skill,
           valid, fresh=None, failed=None, timed_out=None, *, ema_fast: float = 0.98,
           ema_slow: float = 0.85) -> RegretBuffer:
  """Stores one iteration's play results (functional update, jitted, no recompiles).

  Args:
    buf: the buffer.
    rewards_nohint: f32[E, N] unhinted play rewards.
    mask_nohint: bool[E, N] which unhinted plays count.
    rewards_hint: f32[E, M] hinted play rewards (read only for ``fresh`` slots).
    mask_hint: bool[E, M] which hinted plays count.
    skill: i32[E] skill index per slot (-1: not a designer program).
    valid: bool[E] whether each slot holds a valid program.
    fresh: bool[E] slots whose program is new this iteration (default: none).
    failed: bool[E] slots with a play that ended in a sandbox failure (default: none).
    timed_out: bool[E] slots with a play that ended in a timeout (default: none).
    ema_fast: weight of the new value in the fast skill tracker (reference 0.98).
    ema_slow: weight of the new value in the slow skill tracker (reference 0.85).

  Returns:
    The updated buffer.
  """
  e, n, m = buf.num_envs, buf.num_plays, buf.num_hinted
  none = jnp.zeros((e,), bool)
  args = dict(rewards_nohint=(rewards_nohint, (e, n), jnp.float32),
              mask_nohint=(mask_nohint, (e, n), bool),
              rewards_hint=(rewards_hint, (e, m), jnp.float32),
              mask_hint=(mask_hint, (e, m), bool), skill=(skill, (e,), jnp.int32),
              valid=(valid, (e,), bool),
              fresh=(none if fresh is None else fresh, (e,), bool),
              failed=(none if failed is None else failed, (e,), bool),
              timed_out=(none if timed_out is None else timed_out, (e,), bool))
  arrays = {}
  for name, (x, shape, dtype) in args.items():
    x = jnp.asarray(x, dtype)
    _check_shape(name, x, shape)
    arrays[name] = x
  return _record(buf, jnp.float32(ema_fast), jnp.float32(ema_slow), **arrays)


@jax.jit
def _record(buf: RegretBuffer, ema_fast, ema_slow, *, rewards_nohint, mask_nohint,
            rewards_hint, mask_hint, skill, valid, fresh, failed, timed_out) -> RegretBuffer:
  counted = mask_nohint & valid[:, None]
  count = jnp.sum(counted, axis=1).astype(jnp.float32)
  total = jnp.sum(jnp.where(counted, rewards_nohint, 0.0), axis=1)
  wins = jnp.sum(counted & (rewards_nohint > 0), axis=1).astype(jnp.float32)
  hinted = fresh & valid & jnp.any(mask_hint, axis=1)

  # Learning-potential trackers: one per skill, fed that skill's mean unhinted reward.
  s = jnp.arange(buf.num_skills)
  of_skill = (skill[None, :] == s[:, None]) & (count[None, :] > 0)  # [S, E]
  skill_count = jnp.sum(jnp.where(of_skill, count[None, :], 0.0), axis=1)
  r = jnp.sum(jnp.where(of_skill, total[None, :], 0.0), axis=1) / jnp.maximum(skill_count, 1.0)
  has = skill_count > 0

  def track(mu, g):
    return jnp.where(has, jnp.where(buf.skill_seen, (1.0 - g) * mu + g * r, r), mu)

  head = buf.head
  return buf.replace(
      rewards_nohint=rewards_nohint, mask_nohint=mask_nohint,
      rewards_hint=rewards_hint, mask_hint=mask_hint, skill=skill, valid=valid,
      age=jnp.where(fresh, 0, buf.age) + 1,
      hint_mean=jnp.where(fresh, jnp.where(hinted, masked_mean(rewards_hint, mask_hint), 0.0),
                          buf.hint_mean),
      nohint0_mean=jnp.where(fresh, total / jnp.maximum(count, 1.0), buf.nohint0_mean),
      has_hint=jnp.where(fresh, hinted, buf.has_hint),
      hint_win_rate=jnp.where(fresh, masked_mean((rewards_hint > 0).astype(jnp.float32),
                                                 mask_hint), buf.hint_win_rate),
      failed=jnp.where(fresh, False, buf.failed) | failed,
      timed_out=jnp.where(fresh, False, buf.timed_out) | timed_out,
      hist_sum=buf.hist_sum.at[head].set(total),
      hist_count=buf.hist_count.at[head].set(count),
      hist_wins=buf.hist_wins.at[head].set(wins),
      skill_fast=track(buf.skill_fast, ema_fast), skill_slow=track(buf.skill_slow, ema_slow),
      skill_seen=buf.skill_seen | has,
      head=(head + 1) % buf.window, iteration=buf.iteration + 1)


def window_mask(buf: RegretBuffer, credit_window: int) -> jax.Array:
  """Which ring entries count toward each slot's delayed credit.

  Entry ``k`` iterations back (``k = 0`` is the latest record) counts for slot ``e`` when
  ``k < min(credit_window, age[e])``: the window covers the current program's last
  ``credit_window`` iterations.

  Args:
    buf: the buffer.
    credit_window: iterations to average over (static; clipped to ``W``).

  Returns:
    bool[W, E] mask aligned with the ``hist_*`` rings.
  """
  return window_back(buf, credit_window) >= 0


def window_back(buf: RegretBuffer, credit_window: int) -> jax.Array:
  """i32[W, E]: each ring entry's position in its slot's credit window, -1 outside.

  Position 0 is the window's oldest iteration, ``span - 1`` the latest, where
  ``span = min(credit_window, age)`` per slot.
  """
  w = buf.window
  back = (buf.head - 1 - jnp.arange(w)) % w  # [W]: iterations ago each row was written
  recorded = back < jnp.minimum(buf.iteration, w)
  span = jnp.minimum(jnp.int32(min(int(credit_window), w)), buf.age)  # [E]
  inside = recorded[:, None] & (back[:, None] < span[None, :])
  return jnp.where(inside, span[None, :] - 1 - back[:, None], -1)
