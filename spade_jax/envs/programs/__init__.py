"""Env program text: every program the library ships, as files, read one way.

Each program is one ``.py`` file under this folder, named by its file name (unique across
the folders), and read with :func:`load_program`. The files are source text for the
sandbox, never imported:

- ``builtin/``: complete programs of the fixed pool (seed pool and fixed-environment
  baseline), listed per setting in :data:`BUILTIN`; each has ``solution()`` and ``hint()``
  and draws all randomness from the reset seed.
- ``families/``: the body of each procedural family (``envs.families``: imports, helpers
  and the ``...Env`` class reading the knob constants that :class:`~spade_jax.envs.families.
  Family` writes above it) and, where the family has one, ``<family>_work``: the
  ``work(self)`` function of its worked variant.
- ``templates/``: programs completed by code: ``rlve_task`` (the RLVE task env, after the
  task's constants and ``eval.lenient``), ``code_tests`` (the code suites' test runner,
  after the candidate as ``_PROGRAM``) and ``tool_harness`` (the tool-use ``step()``,
  appended to every tool-use program).
- ``examples/``: programs shown to the designer (its prompt's demonstration records).

::

  from spade_jax.envs.programs import load_program, builtin_programs
  src = load_program("guess_secret")
  builtin_programs("tool_use")   # {"library_loans": "...", ...}
"""

from __future__ import annotations

import ast
import functools
import pathlib
from typing import Any

from spade_jax.registry import Registry, UnknownNameError

_DIR = pathlib.Path(__file__).parent
KINDS = ("builtin", "families", "templates", "examples")
"""The folders, in lookup order."""

BUILTIN = {
    "games": ("guess_secret", "running_total", "ordering_puzzle", "grid_walk"),
    "tool_use": ("library_loans", "bank_transfers", "calendar_meetings", "shop_orders"),
}
"""Setting -> its built-in programs, in pool order."""

RENAMED = {"guess_number": "guess_secret", "arithmetic_chain": "running_total",
           "grid_path": "grid_walk"}
"""Old built-in name -> new: the built-ins that shared a name with a family (the old names
are the families' now). Static-pool checkpoints written before the rename resolve through
this table."""


@functools.lru_cache(maxsize=None)
def _index() -> Registry[pathlib.Path]:
  """Name -> file of every program; raises when two files share a name."""
  paths: dict[str, pathlib.Path] = {}
  for kind in KINDS:
    for path in sorted((_DIR / kind).glob("*.py")):
      if path.stem in paths:
        raise RuntimeError(f"env program name {path.stem!r} is used twice: "
                           f"{paths[path.stem].relative_to(_DIR)} and "
                           f"{path.relative_to(_DIR)}; program names must be unique.")
      paths[path.stem] = path
  if not paths:
    raise RuntimeError(f"no env program files under {_DIR}; the package is installed "
                       "without its program files.")
  return Registry("env program", paths)


def program_names(kind: str | None = None) -> tuple[str, ...]:
  """Every program's name (of folder ``kind``, one of :data:`KINDS`, when given)."""
  if kind is not None and kind not in KINDS:
    raise ValueError(f"unknown env program kind {kind!r}; expected one of {list(KINDS)}")
  return tuple(n for n, p in _index().items() if kind is None or p.parent.name == kind)


def program_kind(name: str) -> str:
  """The folder (one of :data:`KINDS`) that holds program ``name``."""
  return _index()[name].parent.name


@functools.lru_cache(maxsize=None)
def load_program(name: str) -> str:
  """The text of program ``name``; raises UnknownNameError listing the valid names."""
  return _index()[name].read_text(encoding="utf-8")


def program_constant(source: str, name: str) -> Any:
  """The literal value of a module-level assignment ``name = ...`` in program ``source``
  (how a family module reads the constants its program text owns)."""
  for node in ast.parse(source).body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
      return ast.literal_eval(node.value)
  raise KeyError(f"the program assigns no module-level constant {name!r}")


def builtin_programs(setting: str = "games") -> dict[str, str]:
  """Name -> source of every built-in program of ``setting``, in pool order."""
  if setting not in BUILTIN:
    raise UnknownNameError(f"no built-in programs for setting {setting!r}; expected one of "
                           f"{sorted(BUILTIN)}")
  return {n: load_program(n) for n in BUILTIN[setting]}


def builtin_program(name: str) -> str:
  """Source of one built-in program (any setting); raises UnknownNameError naming the
  valid ones (and the new name of a renamed one)."""
  if any(name in names for names in BUILTIN.values()):
    return load_program(name)
  valid = sorted(n for names in BUILTIN.values() for n in names)
  renamed = (f" (the built-in {name!r} is now {RENAMED[name]!r}; {name!r} names the env "
             "family)" if name in RENAMED else "")
  raise UnknownNameError(f"unknown built-in env program {name!r}{renamed}; expected one of "
                         f"{valid}")


__all__ = ["BUILTIN", "KINDS", "RENAMED", "builtin_program", "builtin_programs",
           "load_program", "program_constant", "program_kind", "program_names"]
