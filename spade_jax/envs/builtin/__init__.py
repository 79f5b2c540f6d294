"""Built-in env programs: the fixed pool (seed pool and fixed-environment baseline).

Each module in this folder is a complete env program under the spade_jax
contract (see :mod:`spade_jax.envs.program`), with ``solution()`` and ``hint()``,
all randomness drawn from the reset seed. They are stored as source text and
only ever run inside the sandbox, like designer-written programs.
"""

import functools
import pathlib

_DIR = pathlib.Path(__file__).parent
NAMES = ("guess_number", "arithmetic_chain", "ordering_puzzle", "grid_path")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[tuple[str, str], ...]:
  return tuple((name, (_DIR / f"{name}.py").read_text(encoding="utf-8")) for name in NAMES)


def builtin_programs() -> dict[str, str]:
  """Name -> source of every built-in env program."""
  return dict(_load())


def builtin_program(name: str) -> str:
  """Source of one built-in program; raises KeyError naming the valid ones."""
  programs = builtin_programs()
  if name not in programs:
    raise KeyError(f"unknown built-in env program {name!r}; expected one of {sorted(programs)}")
  return programs[name]


__all__ = ["NAMES", "builtin_program", "builtin_programs"]
