"""Designer rewards and agent advantages from a :class:`RegretBuffer`: the regret stage.

One jitted function, :func:`compute_rewards`, turns a buffer into per-env designer rewards
(for the variant named in :class:`RewardConfig`) and per-play agent advantages. The config
is a static argument and the buffer has fixed shapes, so a run compiles it once: changing
how many envs are valid never recompiles.

Per env slot ``e`` with the last ``credit_window`` played iterations of its program:

* ``w``      = mean unhinted win rate over the window;
* ``regret`` = mean (hinted mean - unhinted mean) over the window;
* ``plateau(w)`` = 1 on ``[plateau_lo, plateau_hi]``, else ``max(0, 1 - d / plateau_width)``
  with ``d`` the distance to the interval.

Variants (the :data:`VARIANTS` registry; ``VARIANTS.register(name)`` adds more):

* ``blend`` (reference default): ``regret_weight * clip(regret / regret_scale, 0, 1)
  + plateau_weight * plateau(w)``;
* ``regret``: ``regret``;
* ``learning_potential``: ``|w - ema_slow|``;
* ``micro_learning_potential``: ``|ema_fast - ema_slow|``, the slot's recent trend;
* ``solve_rate``: ``plateau(w)``.

The raw reward is then centred on the mean over valid envs of the same skill (optional),
optionally divided by that skill's standard deviation, and multiplied by ``scale``. Slots
whose program failed validation get ``invalid_penalty`` instead; valid slots with no plays
in the window get 0 and stay out of the skill statistics.

Agent advantages are group-relative per env slot over its unhinted plays, by the
estimator of :data:`spade_jax.rl.ADVANTAGE_ESTIMATORS` that ``RewardConfig.advantage`` names.
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
from spade_jax.selfplay.buffer import RegretBuffer, masked_mean


@flax.struct.dataclass
class EnvStats:
  """Per-slot statistics a reward variant reads. All arrays are f32[E] unless noted.

  Attributes:
    win: mean unhinted win rate over the credit window.
    regret: mean regret over the credit window.
    win_now: unhinted win rate of the latest iteration.
    ema_slow: slow EMA of the win rate.
    ema_fast: fast EMA of the win rate.
    has_data: bool[E], valid and played at least once in the window.
  """
  win: jax.Array
  regret: jax.Array
  win_now: jax.Array
  ema_slow: jax.Array
  ema_fast: jax.Array
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
    plateau_lo: lower edge of the target win-rate band.
    plateau_hi: upper edge of the target win-rate band.
    plateau_width: distance from the band at which the plateau reaches 0.
    invalid_penalty: reward of a slot whose program failed validation (the reference
      implementation uses no penalty, i.e. 0.0).
    center_by_skill: subtract the per-skill mean over valid envs.
    normalize_by_skill_std: also divide by the per-skill standard deviation.
    scale: multiplier applied after centring / normalising.
    credit_window: iterations of a program's history averaged into ``w`` and ``regret``.
    ema_slow: slow EMA decay, passed to ``RegretBuffer.record``.
    ema_fast: fast EMA decay, passed to ``RegretBuffer.record``.
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
  invalid_penalty: float = -1.0
  center_by_skill: bool = True
  normalize_by_skill_std: bool = False
  scale: float = 1.0
  credit_window: int = 4
  ema_slow: float = 0.98
  ema_fast: float = 0.85
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
    for name in ("ema_slow", "ema_fast"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"RewardConfig.{name} must be in [0, 1); got {getattr(self, name)}.")


def plateau(w: jax.Array, lo: float, hi: float, width: float) -> jax.Array:
  """1 on ``[lo, hi]``, falling linearly to 0 at distance ``width`` outside. Any shape."""
  dist = jnp.maximum(lo - w, 0.0) + jnp.maximum(w - hi, 0.0)
  return jnp.maximum(0.0, 1.0 - dist / width)


@VARIANTS.register("blend")
def _blend(s: EnvStats, c: RewardConfig) -> jax.Array:
  regret_term = jnp.clip(s.regret / c.regret_scale, 0.0, 1.0)
  return (c.regret_weight * regret_term +
          c.plateau_weight * plateau(s.win, c.plateau_lo, c.plateau_hi, c.plateau_width))


@VARIANTS.register("regret")
def _regret(s: EnvStats, c: RewardConfig) -> jax.Array:
  del c
  return s.regret


@VARIANTS.register("learning_potential")
def _learning_potential(s: EnvStats, c: RewardConfig) -> jax.Array:
  del c
  return jnp.abs(s.win - s.ema_slow)


@VARIANTS.register("micro_learning_potential")
def _micro_learning_potential(s: EnvStats, c: RewardConfig) -> jax.Array:
  del c
  return jnp.abs(s.ema_fast - s.ema_slow)


@VARIANTS.register("solve_rate")
def _solve_rate(s: EnvStats, c: RewardConfig) -> jax.Array:
  return plateau(s.win, c.plateau_lo, c.plateau_hi, c.plateau_width)


@flax.struct.dataclass
class RewardOutput:
  """Result of :func:`compute_rewards`.

  Attributes:
    designer: f32[E] designer reward per env slot.
    agent_advantages: f32[E, N] advantage per unhinted play (0 where masked out).
    metrics: dict of f32 scalars and f32[E] per-env arrays.
  """
  designer: jax.Array
  agent_advantages: jax.Array
  metrics: dict[str, jax.Array]


def env_stats(buf: RegretBuffer, credit_window: int) -> EnvStats:
  """Windowed per-slot statistics; see :class:`EnvStats`."""
  mask = buf.window_mask(credit_window)  # [W, E]
  played_now = buf.valid & jnp.any(buf.mask_nohint, axis=1)
  return EnvStats(
      win=masked_mean(buf.hist_win, mask, axis=0),
      regret=masked_mean(buf.hist_regret, mask, axis=0),
      win_now=jnp.where(played_now, masked_mean(buf.rewards_nohint, buf.mask_nohint), 0.0),
      ema_slow=buf.ema_slow, ema_fast=buf.ema_fast,
      has_data=buf.valid & jnp.any(mask, axis=0))


def skill_centre(raw: jax.Array, skill: jax.Array, member: jax.Array, normalize: bool,
                 eps: float) -> tuple[jax.Array, jax.Array]:
  """Subtracts each env's skill mean over member envs (and divides by the skill std).

  Args:
    raw: f32[E] raw rewards.
    skill: i32[E] skill index.
    member: bool[E] envs that enter the statistics.
    normalize: divide by the per-skill standard deviation too.
    eps: floor for the standard deviation.

  Returns:
    (f32[E] centred rewards, f32[E] per-env skill mean).
  """
  same = (skill[:, None] == skill[None, :]) & member[None, :]  # [E, E]
  mean = masked_mean(jnp.broadcast_to(raw[None, :], same.shape), same, axis=1)
  out = raw - mean
  if normalize:
    var = masked_mean(jnp.square(raw[None, :] - mean[:, None]), same, axis=1)
    out = out / (jnp.sqrt(var) + eps)
  return out, mean


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
  """Designer rewards for ``cfg.variant`` and agent advantages, in one compiled call.

  Args:
    buf: the regret buffer (E slots, N unhinted plays, W history).
    cfg: reward config (static).

  Returns:
    A :class:`RewardOutput` with ``designer`` f32[E] and ``agent_advantages`` f32[E, N].
  """
  stats = env_stats(buf, cfg.credit_window)
  raw = VARIANTS[cfg.variant](stats, cfg).astype(jnp.float32)
  member = stats.has_data
  if cfg.center_by_skill:
    centred, skill_mean = skill_centre(raw, buf.skill, member, cfg.normalize_by_skill_std,
                                       cfg.eps)
  else:
    centred, skill_mean = raw, jnp.zeros_like(raw)
  designer = jnp.where(member, centred * cfg.scale, 0.0)
  designer = jnp.where(buf.valid, designer, jnp.float32(cfg.invalid_penalty))
  n_member = jnp.maximum(jnp.sum(member), 1)

  def avg(x):
    return jnp.sum(jnp.where(member, x, 0.0)) / n_member

  metrics = {
      "valid_frac": jnp.mean(buf.valid.astype(jnp.float32)),
      "credited_frac": jnp.mean(member.astype(jnp.float32)),
      "reward_mean": jnp.mean(designer),
      "raw_mean": avg(raw),
      "regret_mean": avg(stats.regret),
      "win_rate_mean": avg(stats.win),
      "learning_potential_mean": avg(jnp.abs(stats.win - stats.ema_slow)),
      "per_env/raw": raw,
      "per_env/regret": stats.regret,
      "per_env/win_rate": stats.win,
      "per_env/skill_mean": skill_mean,
  }
  adv = agent_advantages(buf, cfg)
  return RewardOutput(designer=designer, agent_advantages=adv, metrics=metrics)

