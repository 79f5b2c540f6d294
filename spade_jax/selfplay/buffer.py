"""Regret buffer: fixed-shape per-iteration play results and a short history ring.

Shapes are set once by :meth:`RegretBuffer.create` (``E`` env slots, ``N`` unhinted plays,
``M`` hinted plays, ``W`` history iterations) and never change, so every jitted consumer
compiles once no matter how many envs were valid or played in a round.

An env slot holds one designer program for several iterations (regenerated every few
iterations). Each :meth:`RegretBuffer.record` call stores one iteration's results for all
slots, pushes the per-slot unhinted win rate and regret into the ring, and advances two
exponential moving averages of the win rate per slot. A slot marked ``fresh`` starts a new
program: its age, play count and averages restart, and older ring entries stop counting
for it. Designer rewards (``spade_jax.designer.rewards``) average over the last
``credit_window`` ring entries of each slot's current program; that is the delayed credit.

Typical order in one iteration::

  buf = buf.record(r_nohint, m_nohint, r_hint, m_hint, skill, valid, fresh=new_programs)
  if credit_due:
    rewards, metrics = designer_rewards(buf, reward_cfg)
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class RegretBuffer:
  """Play results of the current iteration plus a ring of past per-slot statistics.

  Attributes:
    rewards_nohint: f32[E, N] unhinted play rewards (current iteration).
    mask_nohint: bool[E, N] which unhinted plays happened.
    rewards_hint: f32[E, M] hinted play rewards (same seeds as the unhinted plays).
    mask_hint: bool[E, M] which hinted plays happened.
    skill: i32[E] skill index of each slot's program.
    valid: bool[E] whether each slot's program passed validation.
    age: i32[E] iterations recorded since the slot's program was installed.
    num_played: i32[E] of those, iterations in which the slot was played.
    hist_win: f32[W, E] ring of per-slot mean unhinted reward.
    hist_regret: f32[W, E] ring of per-slot regret (hinted mean - unhinted mean).
    hist_played: bool[W, E] ring of "slot was valid and played" flags.
    ema_slow: f32[E] slow EMA of the slot's unhinted win rate.
    ema_fast: f32[E] fast EMA of the slot's unhinted win rate.
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
  num_played: jax.Array
  hist_win: jax.Array
  hist_regret: jax.Array
  hist_played: jax.Array
  ema_slow: jax.Array
  ema_fast: jax.Array
  head: jax.Array
  iteration: jax.Array

  @classmethod
  def create(cls, num_envs: int, num_plays: int, num_hinted: int,
             window: int = 4) -> RegretBuffer:
    """An empty buffer.

    Args:
      num_envs: E, env slots per iteration.
      num_plays: N, unhinted plays per env.
      num_hinted: M, hinted plays per env.
      window: W, iterations of history kept (>= the reward config's credit window).

    Returns:
      A buffer with every slot invalid and an empty history.
    """
    for name, v in (("num_envs", num_envs), ("num_plays", num_plays),
                    ("num_hinted", num_hinted), ("window", window)):
      if int(v) < 1:
        raise ValueError(f"RegretBuffer.create needs {name} >= 1; got {v}.")
    e, n, m, w = int(num_envs), int(num_plays), int(num_hinted), int(window)
    f32 = jnp.float32
    return cls(
        rewards_nohint=jnp.zeros((e, n), f32), mask_nohint=jnp.zeros((e, n), bool),
        rewards_hint=jnp.zeros((e, m), f32), mask_hint=jnp.zeros((e, m), bool),
        skill=jnp.zeros((e,), jnp.int32), valid=jnp.zeros((e,), bool),
        age=jnp.zeros((e,), jnp.int32), num_played=jnp.zeros((e,), jnp.int32),
        hist_win=jnp.zeros((w, e), f32), hist_regret=jnp.zeros((w, e), f32),
        hist_played=jnp.zeros((w, e), bool),
        ema_slow=jnp.zeros((e,), f32), ema_fast=jnp.zeros((e,), f32),
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
    return self.hist_win.shape[0]

  def record(self, rewards_nohint, mask_nohint, rewards_hint, mask_hint, skill, valid,
             fresh=None, *, ema_slow: float = 0.98, ema_fast: float = 0.85) -> RegretBuffer:
    """Stores one iteration's results; see :func:`record`."""
    return record(self, rewards_nohint, mask_nohint, rewards_hint, mask_hint, skill, valid,
                  fresh, ema_slow=ema_slow, ema_fast=ema_fast)

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
           valid, fresh=None, *, ema_slow: float = 0.98,
           ema_fast: float = 0.85) -> RegretBuffer:
  """Stores one iteration's play results (functional update, jitted, no recompiles).

  Args:
    buf: the buffer.
    rewards_nohint: f32[E, N] unhinted play rewards.
    mask_nohint: bool[E, N] which unhinted plays happened.
    rewards_hint: f32[E, M] hinted play rewards.
    mask_hint: bool[E, M] which hinted plays happened.
    skill: i32[E] skill index per slot.
    valid: bool[E] validation verdict per slot.
    fresh: bool[E] slots whose program is new this iteration (default: none).
    ema_slow: slow EMA decay (reference 0.98).
    ema_fast: fast EMA decay (reference 0.85).

  Returns:
    The updated buffer.
  """
  e, n, m = buf.num_envs, buf.num_plays, buf.num_hinted
  args = dict(rewards_nohint=(rewards_nohint, (e, n), jnp.float32),
              mask_nohint=(mask_nohint, (e, n), bool),
              rewards_hint=(rewards_hint, (e, m), jnp.float32),
              mask_hint=(mask_hint, (e, m), bool), skill=(skill, (e,), jnp.int32),
              valid=(valid, (e,), bool),
              fresh=(jnp.zeros((e,), bool) if fresh is None else fresh, (e,), bool))
  arrays = {}
  for name, (x, shape, dtype) in args.items():
    x = jnp.asarray(x, dtype)
    _check_shape(name, x, shape)
    arrays[name] = x
  return _record(buf, jnp.float32(ema_slow), jnp.float32(ema_fast), **arrays)


@jax.jit
def _record(buf: RegretBuffer, ema_slow, ema_fast, *, rewards_nohint, mask_nohint,
            rewards_hint, mask_hint, skill, valid, fresh) -> RegretBuffer:
  played = valid & jnp.any(mask_nohint, axis=1)
  hinted = played & jnp.any(mask_hint, axis=1)
  win = jnp.where(played, masked_mean(rewards_nohint, mask_nohint), 0.0)
  regret = jnp.where(hinted, masked_mean(rewards_hint, mask_hint) - win, 0.0)

  age = jnp.where(fresh, 0, buf.age) + 1
  prior_plays = jnp.where(fresh, 0, buf.num_played)
  first = prior_plays == 0

  def ema(old, gamma):
    updated = jnp.where(first, win, gamma * old + (1.0 - gamma) * win)
    return jnp.where(played, updated, jnp.where(fresh, 0.0, old))

  head = buf.head
  return buf.replace(
      rewards_nohint=rewards_nohint, mask_nohint=mask_nohint,
      rewards_hint=rewards_hint, mask_hint=mask_hint, skill=skill, valid=valid,
      age=age, num_played=prior_plays + played.astype(jnp.int32),
      hist_win=buf.hist_win.at[head].set(win),
      hist_regret=buf.hist_regret.at[head].set(regret),
      hist_played=buf.hist_played.at[head].set(played),
      ema_slow=ema(buf.ema_slow, ema_slow), ema_fast=ema(buf.ema_fast, ema_fast),
      head=(head + 1) % buf.window, iteration=buf.iteration + 1)


def window_mask(buf: RegretBuffer, credit_window: int) -> jax.Array:
  """Which ring entries count toward each slot's delayed credit.

  Entry ``k`` iterations back (``k = 0`` is the latest record) counts for slot ``e`` when
  ``k < min(credit_window, age[e])`` and the slot was played that iteration.

  Args:
    buf: the buffer.
    credit_window: iterations to average over (static; clipped to ``W``).

  Returns:
    bool[W, E] mask aligned with ``hist_win`` / ``hist_regret``.
  """
  w = buf.window
  slots = jnp.arange(w)
  back = (buf.head - 1 - slots) % w  # [W]: how many iterations ago each ring row was written.
  recorded = back < jnp.minimum(buf.iteration, w)
  span = jnp.minimum(jnp.int32(min(int(credit_window), w)), buf.age)  # [E]
  return recorded[:, None] & (back[:, None] < span[None, :]) & buf.hist_played
