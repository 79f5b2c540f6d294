"""The regret stage: designer rewards and agent advantages from a :class:`RegretBuffer`.

Two jitted functions with the config as a static argument and fixed shapes, so a run
compiles each once however many envs were valid:

* :func:`compute_rewards` (every iteration): per env slot, the statistics of its program
  over the credit window, the raw designer score of the variant ``RewardConfig.variant``,
  and per-play agent advantages (group-relative per env over its unhinted plays, by the
  estimator ``RewardConfig.advantage`` of ``spade_jax.rl.ADVANTAGE_ESTIMATORS``);
* :func:`credit` (when a cohort of designer samples is due): each sample's reward.

Notation per slot (docs/METHOD.md §2): ``Rh`` mean hinted reward and ``Rn0`` mean unhinted reward
at the regeneration step, ``w`` mean unhinted episode reward over the credit window,
``plateau(w)`` = 1 on ``[plateau_lo, plateau_hi]``, else ``max(0, 1 - d / plateau_width)``
with ``d`` the distance to the band. Variants (:data:`VARIANTS`; ``VARIANTS.register(name)``
adds more):

* ``blend`` (paper recipe): ``regret_weight * clip((Rh - Rn0) / regret_scale, 0, 1)
  + plateau_weight * plateau(w)``;
* ``regret_based``: ``max(0, Rh - w)``; an env whose play timed out scores
  ``timeout_score`` (-0.5);
* ``learning_potential``: ``|w - mu_slow|``, ``mu_slow`` the slow tracker of the env's skill;
* ``micro_lp``: ``max(0, late - early)``, the mean unhinted reward of the late half of the
  window minus that of the early half;
* ``solve_rate``: ``plateau(w)``.

Credit: a cohort is the designer samples credited together (those written at one
regeneration). Each sample's value is its env's raw score, or ``invalid_penalty`` for a
program that failed validation, or ``crash_penalty`` for a valid program whose plays hit a
sandbox failure (None: no gradient, as the reference); under ``regret_based`` a program
whose play timed out keeps its own score, ``timeout_score``. A failed program is replaced
before its credit is due, so the caller passes each sample's raw score and timeout flag as
they stood when it failed (the slot's current ones belong to its replacement). Values are
centred on the mean value of the same skill in the cohort (no division by the std unless
``normalize_by_skill_std``) and multiplied by ``scale``, the reference's
``min(plays_per_env * regen_every, 50)`` when left None.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp

from spade_jax.registry import Registry
from spade_jax.rl.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from spade_jax.selfplay.buffer import RegretBuffer, masked_mean, window_back

# What happened to one designer sample (the `kinds` argument of `credit`).
NONE, PLAYED, INVALID, FAILED, NO_DATA = range(5)
KIND_NAMES = ("none", "played", "invalid", "failed", "no_data")
# Variants that score a timed-out program themselves (its FAILED sample keeps its raw).
SCORES_TIMEOUTS = ("regret_based",)
SCALE_CAP = 50.0


@flax.struct.dataclass
class EnvStats:
  """Per-slot statistics the variants read; f32[E] unless noted.

  Attributes:
    w: mean unhinted reward over the credit window.
    win_rate: fraction of the window's unhinted plays with reward > 0.
    rh: ``Rh``, mean hinted reward at the regeneration step.
    rn0: ``Rn0``, mean unhinted reward at the regeneration step.
    has_hint: bool[E], hinted plays counted at the regeneration step.
    early: mean unhinted reward over the early half of the window.
    late: mean unhinted reward over the late half of the window.
    has_early: bool[E], the early half holds plays.
    mu_slow: the slow learning-potential tracker of the slot's skill (0 for no skill).
    timed_out: bool[E], a play of the program timed out.
    has_data: bool[E], valid and played at least once in the window.
  """
  w: jax.Array
  win_rate: jax.Array
  rh: jax.Array
  rn0: jax.Array
  has_hint: jax.Array
  early: jax.Array
  late: jax.Array
  has_early: jax.Array
  mu_slow: jax.Array
  timed_out: jax.Array
  has_data: jax.Array


VariantFn = Callable[[EnvStats, "RewardConfig"], jax.Array]
# Designer-reward variants: ``fn(stats, cfg) -> f32[E]`` raw scores.
VARIANTS: Registry[VariantFn] = Registry("designer reward variant", field="rewards.variant")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Designer-reward and agent-advantage settings (static, hashable).

  Attributes:
    variant: registered variant name (see module docstring).
    regret_scale: regret at which the blend's regret term saturates (reference 0.15).
    regret_weight: weight of the clipped regret term in ``blend`` (reference 0.4).
    plateau_weight: weight of the plateau term in ``blend`` (reference 0.6).
    plateau_lo: lower edge of the target win-rate band (reference 0.4).
    plateau_hi: upper edge of the target win-rate band (reference 0.6).
    plateau_width: distance from the band at which the plateau reaches 0 (reference 0.25).
    timeout_score: ``regret_based`` score of an env whose play timed out (reference -0.5).
    invalid_penalty: value of a designer sample whose program failed validation, centred
      with its cohort; None gives it no gradient (the reference).
    crash_penalty: value of a valid program whose plays hit a sandbox failure, centred
      with its cohort; None gives it no gradient (the reference blacklists such envs).
    center_by_skill: subtract the mean value of the same skill in the cohort.
    normalize_by_skill_std: also divide by that skill's standard deviation.
    scale: multiplier after centring; None: ``min(plays * regen_every, 50)``.
    credit_window: iterations of a program's history in ``w`` (reference = regen_every).
    ema_fast: weight of the new value in the fast skill tracker (reference 0.98).
    ema_slow: weight of the new value in the slow skill tracker (reference 0.85).
    advantage: agent advantage estimator, a name in ``spade_jax.rl.ADVANTAGE_ESTIMATORS``
      ("grpo": z-scored per env; "dr_grpo": mean-centred; "rloo": leave-one-out).
    eps: numerical floor for standard deviations.
  """
  variant: str = "blend"
  regret_scale: float = 0.15
  regret_weight: float = 0.4
  plateau_weight: float = 0.6
  plateau_lo: float = 0.4
  plateau_hi: float = 0.6
  plateau_width: float = 0.25
  timeout_score: float = -0.5
  invalid_penalty: float | None = -1.0
  crash_penalty: float | None = -1.0
  center_by_skill: bool = True
  normalize_by_skill_std: bool = False
  scale: float | None = None
  credit_window: int = 4
  ema_fast: float = 0.98
  ema_slow: float = 0.85
  advantage: str = "grpo"
  eps: float = 1e-6

  def __post_init__(self):
    VARIANTS.check(self.variant)
    ADVANTAGE_ESTIMATORS.check(self.advantage)
    if self.regret_scale <= 0 or self.plateau_width <= 0:
      raise ValueError(f"RewardConfig needs regret_scale > 0 and plateau_width > 0; got "
                       f"{self.regret_scale} and {self.plateau_width}.")
    if not self.plateau_lo <= self.plateau_hi:
      raise ValueError(f"RewardConfig needs plateau_lo <= plateau_hi; got "
                       f"[{self.plateau_lo}, {self.plateau_hi}].")
    if self.credit_window < 1:
      raise ValueError(f"RewardConfig.credit_window must be >= 1; got {self.credit_window}.")
    for name in ("ema_fast", "ema_slow"):
      if not 0.0 < getattr(self, name) <= 1.0:
        raise ValueError(f"RewardConfig.{name} weights the new value and must be in (0, 1]; "
                         f"got {getattr(self, name)}.")


def reference_scale(plays: int, regen_every: int) -> float:
  """The reference's designer-reward scale: ``min(plays_per_env * regen_every, 50)``."""
  return float(min(plays * regen_every, SCALE_CAP))


def plateau(w: jax.Array, lo: float, hi: float, width: float) -> jax.Array:
  """1 on ``[lo, hi]``, falling linearly to 0 at distance ``width`` outside. Any shape."""
  dist = jnp.maximum(lo - w, 0.0) + jnp.maximum(w - hi, 0.0)
  return jnp.maximum(0.0, 1.0 - dist / width)


@VARIANTS.register("blend")
def _blend(s: EnvStats, c: RewardConfig) -> jax.Array:
  regret = jnp.where(s.has_hint, s.rh - s.rn0, 0.0)
  return (c.regret_weight * jnp.clip(regret / c.regret_scale, 0.0, 1.0) +
          c.plateau_weight * plateau(s.w, c.plateau_lo, c.plateau_hi, c.plateau_width))


@VARIANTS.register("regret_based")
def _regret_based(s: EnvStats, c: RewardConfig) -> jax.Array:
  regret = jnp.where(s.has_hint, jnp.maximum(0.0, s.rh - s.w), 0.0)
  return jnp.where(s.timed_out, c.timeout_score, regret)


@VARIANTS.register("learning_potential")
def _learning_potential(s: EnvStats, c: RewardConfig) -> jax.Array:
  del c
  return jnp.abs(s.w - s.mu_slow)


@VARIANTS.register("micro_lp")
def _micro_lp(s: EnvStats, c: RewardConfig) -> jax.Array:
  del c
  return jnp.where(s.has_early, jnp.maximum(0.0, s.late - s.early), 0.0)


@VARIANTS.register("solve_rate")
def _solve_rate(s: EnvStats, c: RewardConfig) -> jax.Array:
  return plateau(s.w, c.plateau_lo, c.plateau_hi, c.plateau_width)


@flax.struct.dataclass
class RewardOutput:
  """Result of :func:`compute_rewards`.

  Attributes:
    raw: f32[E] raw designer score of each slot's program (the variant's).
    stats: the :class:`EnvStats` the variant read.
    agent_advantages: f32[E, N] advantage per unhinted play (0 where masked out).
    metrics: dict of f32 scalars.
  """
  raw: jax.Array
  stats: EnvStats
  agent_advantages: jax.Array
  metrics: dict[str, jax.Array]


def env_stats(buf: RegretBuffer, credit_window: int) -> EnvStats:
  """Per-slot statistics over each program's credit window; see :class:`EnvStats`."""
  pos = window_back(buf, credit_window)  # [W, E], -1 outside the window
  inside = pos >= 0
  span = jnp.max(pos, axis=0) + 1  # [E]
  early = inside & (pos < (span // 2)[None, :])
  late = inside & ~early

  def mean(sel):
    count = jnp.sum(jnp.where(sel, buf.hist_count, 0.0), axis=0)
    return jnp.sum(jnp.where(sel, buf.hist_sum, 0.0), axis=0) / jnp.maximum(count, 1.0), count

  w, count = mean(inside)
  wins = jnp.sum(jnp.where(inside, buf.hist_wins, 0.0), axis=0)
  e_mean, e_count = mean(early)
  l_mean, _ = mean(late)
  has_skill = buf.skill >= 0
  mu_slow = jnp.where(has_skill, buf.skill_slow[jnp.maximum(buf.skill, 0)], 0.0)
  return EnvStats(w=w, win_rate=wins / jnp.maximum(count, 1.0), rh=buf.hint_mean,
                  rn0=buf.nohint0_mean, has_hint=buf.has_hint, early=e_mean, late=l_mean,
                  has_early=e_count > 0, mu_slow=mu_slow, timed_out=buf.timed_out,
                  has_data=buf.valid & (count > 0))


def agent_advantages(buf: RegretBuffer, cfg: RewardConfig) -> jax.Array:
  """Group-relative advantages of the unhinted plays, one group per env slot.

  Args:
    buf: the buffer (current iteration's plays).
    cfg: names the estimator (``cfg.advantage``) and its ``eps``.

  Returns:
    f32[E, N]: advantages of masked-in plays of valid envs, 0 elsewhere.
  """
  E, N = buf.rewards_nohint.shape
  valid = buf.mask_nohint & buf.valid[:, None]
  groups = jnp.broadcast_to(jnp.arange(E, dtype=jnp.int32)[:, None], (E, N))
  adv = compute_advantages(cfg.advantage, buf.rewards_nohint.reshape(-1), groups.reshape(-1),
                           valid.reshape(-1), E, cfg.eps)
  return adv.reshape(E, N)


@functools.partial(jax.jit, static_argnames=("cfg",))
def compute_rewards(buf: RegretBuffer, cfg: RewardConfig) -> RewardOutput:
  """Raw designer scores, window statistics and agent advantages, in one compiled call.

  Args:
    buf: the regret buffer (E slots, N unhinted plays, W history).
    cfg: reward config (static).

  Returns:
    A :class:`RewardOutput`.
  """
  stats = env_stats(buf, cfg.credit_window)
  raw = VARIANTS[cfg.variant](stats, cfg).astype(jnp.float32)
  member = stats.has_data
  n = jnp.maximum(jnp.sum(member), 1)

  def avg(x):
    return jnp.sum(jnp.where(member, x, 0.0)) / n

  metrics = {
      "valid_frac": jnp.mean(buf.valid.astype(jnp.float32)),
      "played_frac": jnp.mean(member.astype(jnp.float32)),
      "raw_mean": avg(raw),
      "regret_mean": avg(jnp.where(stats.has_hint, stats.rh - stats.rn0, 0.0)),
      "win_rate_mean": avg(stats.win_rate),
      "w_mean": avg(stats.w),
      "plateau_frac": avg(((stats.w >= cfg.plateau_lo) & (stats.w <= cfg.plateau_hi))
                          .astype(jnp.float32)),
      # Share of played envs whose unhinted win rate lies in the target band.
      "win_rate_band_frac": avg(((stats.win_rate >= cfg.plateau_lo)
                                 & (stats.win_rate <= cfg.plateau_hi)).astype(jnp.float32)),
  }
  return RewardOutput(raw=raw, stats=stats, agent_advantages=agent_advantages(buf, cfg),
                      metrics=metrics)


@functools.partial(jax.jit, static_argnames=("cfg",))
def credit(raw: jax.Array, kinds: jax.Array, skill: jax.Array, timed_out: jax.Array,
           cfg: RewardConfig) -> tuple[jax.Array, jax.Array]:
  """Rewards of one cohort of designer samples.

  Args:
    raw: f32[E, A] raw score of each sample: its slot's ``RewardOutput.raw`` at the credit
      for a ``PLAYED`` sample; for a ``FAILED`` one, the slot's raw score in the iteration
      it failed (read only when ``regret_based`` scores its timeout). Else unused.
    kinds: i32[E, A] what happened to each of a slot's (up to A) samples: ``NONE``,
      ``PLAYED`` (the slot's valid program; value ``raw``), ``INVALID``, ``FAILED`` or
      ``NO_DATA`` (valid but never played in the window: no gradient).
    skill: i32[E] skill the slot's samples were written for.
    timed_out: bool[E, A] a ``FAILED`` sample's program failed by a timeout rather than a
      crash (``regret_based`` then scores it ``raw``, its own ``timeout_score``, instead of
      the crash penalty).
    cfg: reward config (static); ``cfg.scale`` must be set.

  Returns:
    (f32[E, A] rewards, bool[E, A] which samples get a gradient).
  """
  if cfg.scale is None:
    raise ValueError("credit() needs RewardConfig.scale; resolve it with reference_scale().")
  for name, x in (("raw", raw), ("timed_out", timed_out)):
    if tuple(x.shape) != tuple(kinds.shape):
      raise ValueError(f"credit(): {name} has shape {tuple(x.shape)}; it is per sample, "
                       f"the shape of kinds {tuple(kinds.shape)} ([E, A]).")
  own = (kinds == PLAYED) | ((kinds == FAILED) & jnp.asarray(timed_out, bool)
                             & (cfg.variant in SCORES_TIMEOUTS))
  value = jnp.asarray(raw, jnp.float32)
  use = own
  if cfg.invalid_penalty is not None:
    value = jnp.where(kinds == INVALID, jnp.float32(cfg.invalid_penalty), value)
    use = use | (kinds == INVALID)
  if cfg.crash_penalty is not None:
    failed = (kinds == FAILED) & ~own
    value = jnp.where(failed, jnp.float32(cfg.crash_penalty), value)
    use = use | failed
  if cfg.center_by_skill:
    flat_v, flat_u = value.reshape(-1), use.reshape(-1)
    flat_s = jnp.broadcast_to(skill[:, None], kinds.shape).reshape(-1)
    same = (flat_s[:, None] == flat_s[None, :]) & flat_u[None, :]
    mean = masked_mean(jnp.broadcast_to(flat_v[None, :], same.shape), same, axis=1)
    out = flat_v - mean
    if cfg.normalize_by_skill_std:
      var = masked_mean(jnp.square(flat_v[None, :] - mean[:, None]), same, axis=1)
      out = out / (jnp.sqrt(var) + cfg.eps)
    value = out.reshape(kinds.shape)
  return jnp.where(use, value * cfg.scale, 0.0), use
