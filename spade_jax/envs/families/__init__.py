"""Procedural env families: parameterised games-setting programs with difficulty knobs.

Each family renders complete env programs (run only in the sandbox) whose difficulty
knobs are module-level constants; every program has ``solution()`` and ``hint()``. They
feed the small-scale mechanism experiment (``experiments/mechanism``): warm-start data, the
static-pool arm and the held-out evaluation::

  from spade_jax.envs.families import FAMILIES, HELD_OUT
  src = FAMILIES["guess_number"].program_at("hard")
"""

from __future__ import annotations

from spade_jax.envs.families import (arithmetic_chain, base_convert, code_breaker,
                                     coin_ledger, grid_path, guess_number, knights_knaves,
                                     number_sequence, ordering, pet_owners, prime_factors,
                                     reach_target)
from spade_jax.envs.families.base import (LEVEL_NAMES, MEDIUM, NUM_LEVELS, Family, Knob,
                                          change_letter, shift_int)
from spade_jax.registry import Registry

FAMILIES: Registry[Family] = Registry("env family", {
    m.FAMILY.name: m.FAMILY
    for m in (arithmetic_chain, guess_number, knights_knaves, ordering, prime_factors,
              reach_target, base_convert, code_breaker, pet_owners, grid_path,
              number_sequence, coin_ledger)
}, field="families")
"""Name -> :class:`Family`."""

HELD_OUT = "coin_ledger"
"""The family kept out of warm-start data, pools and training: evaluation only. Its actions
are the seen families' (``ordering``'s names, ``arithmetic_chain``-sized sums), so a model
that learned the seen families can win it; ``knights_knaves`` (answers no seen family
uses) is a seen family."""


def seen_families() -> tuple[str, ...]:
  """Every family except :data:`HELD_OUT`, in registry order."""
  return tuple(n for n in FAMILIES if n != HELD_OUT)


def by_skill(names=None) -> dict[str, tuple[str, ...]]:
  """Skill -> the families (of ``names``, default all seen ones) that train it."""
  out: dict[str, list[str]] = {}
  for n in names if names is not None else seen_families():
    out.setdefault(FAMILIES[n].skill, []).append(n)
  return {k: tuple(v) for k, v in out.items()}


__all__ = ["FAMILIES", "Family", "HELD_OUT", "Knob", "LEVEL_NAMES", "MEDIUM", "NUM_LEVELS",
           "by_skill", "change_letter", "seen_families", "shift_int"]
