"""Built-in env programs: the fixed pool (seed pool and fixed-environment baseline).

Each module in this folder is a complete env program under the spade_jax contract of its
setting (see :mod:`spade_jax.envs.contract`), with ``solution()`` and ``hint()``, all
randomness drawn from the reset seed. They are stored as source text and only ever run
inside the sandbox, like designer-written programs.
"""

import functools
import pathlib

_DIR = pathlib.Path(__file__).parent
# Programs per setting.
NAMES = {
    "games": ("guess_number", "arithmetic_chain", "ordering_puzzle", "grid_path"),
    "tool_use": ("library_loans", "bank_transfers", "calendar_meetings", "shop_orders"),
}


@functools.lru_cache(maxsize=None)
def _load(setting: str) -> tuple[tuple[str, str], ...]:
  if setting not in NAMES:
    raise KeyError(f"no built-in programs for setting {setting!r}; expected one of "
                   f"{sorted(NAMES)}")
  return tuple((n, (_DIR / f"{n}.py").read_text(encoding="utf-8")) for n in NAMES[setting])


def builtin_programs(setting: str = "games") -> dict[str, str]:
  """Name -> source of every built-in env program of ``setting``."""
  return dict(_load(setting))


def builtin_program(name: str) -> str:
  """Source of one built-in program (any setting); raises KeyError naming the valid ones."""
  for setting in NAMES:
    programs = builtin_programs(setting)
    if name in programs:
      return programs[name]
  raise KeyError(f"unknown built-in env program {name!r}; expected one of "
                 f"{sorted(n for names in NAMES.values() for n in names)}")


__all__ = ["NAMES", "builtin_program", "builtin_programs"]
