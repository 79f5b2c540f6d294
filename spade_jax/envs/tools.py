"""Starting env programs in the sandbox, with the tool-use harness where the setting has one.

A tool-use program (docs/METHOD.md §5) defines tools, tasks and criteria but no ``step``: the
harness (the template ``tool_harness`` of :mod:`spade_jax.envs.programs`) runs the
conversation. Its source is appended to the program's and the combination is what the
sandbox loads, so the harness runs in the same confined worker as the program it drives.
:func:`start` is the one way the library starts programs of a setting (validation,
self-play episodes, hints, ``launch.check_env``).
"""

from __future__ import annotations

from collections.abc import Sequence

from spade_jax.envs import program as program_lib
from spade_jax.envs.contract import SETTINGS
from spade_jax.envs.programs import load_program

HARNESS_CLASS = "SpadeToolUseEnv"


def harness_source() -> str:
  return load_program("tool_harness")


def runnable(source: str, setting: str, class_name: str | None = None
             ) -> tuple[str, str | None]:
  """(source the sandbox loads, class to instantiate) for a program of ``setting``.

  Games programs run as written. A tool-use program gets the harness appended and its env
  class (``class_name``, or the last ``...Env`` class with ``tool_`` methods) wrapped.
  """
  if not SETTINGS[setting].tool_harness:
    return source, class_name
  if class_name is None:
    class_name = program_lib.env_class_name(source, tools=True)
  if class_name is None:
    return source, None  # the sandbox reports the contract breach
  return (f"{source}\n\n{harness_source()}\n\n{HARNESS_CLASS} = _spade_tool_env({class_name})\n",
          HARNESS_CLASS)


def start(pool, sources: Sequence[str], setting: str, max_turns: int, *,
          class_names: Sequence[str | None] | None = None, kwargs: dict | None = None):
  """Starts one sandboxed instance per source, the way ``setting`` runs its programs
  (``kwargs`` go to the program's ``__init__``)."""
  names = list(class_names) if class_names is not None else [None] * len(sources)
  pairs = [runnable(src, setting, name) for src, name in zip(sources, names)]
  return pool.start([p[0] for p in pairs], max_turns=max_turns,
                    class_names=[p[1] for p in pairs], kwargs=kwargs,
                    action_mode=SETTINGS[setting].action_mode)


__all__ = ["HARNESS_CLASS", "harness_source", "runnable", "start"]
