"""The families as a library that env programs import: short programs that set knobs.

A *library program* is a complete env program of the games setting (it passes the static
checks and runs only in the sandbox) that takes a family's game from the sandbox module
``families`` instead of spelling it out: the family's title, its knob constants and a thin
``...Env`` class::

  '''Guess a secret integer from higher/lower feedback.'''

  from families import guess_number

  # Difficulty knobs of the 'guess_number' family.
  HIGH = 63  # the secret is in [1, HIGH]
  SLACK = 2  # guesses beyond the halving worst case
  TURNS = 8  # turns the game allows


  class GuessNumberEnv(guess_number.Game):

    def reset(self, seed=None, options=None):
      return self.start(seed, options, HIGH=HIGH, SLACK=SLACK, TURNS=TURNS)

    def step(self, action):
      return self.move(action)

It plays exactly as :meth:`Family.program` at the same knob values (the worker runs the
family's body with the knobs as its globals), inherits ``solution()`` and ``hint()``, and
is about a tenth as long: a designer writes ~130 tokens instead of up to 1,448.

To run them: ``SandboxConfig(modules=(__name__,))`` makes every worker build the module
(:func:`sandbox_module`, from ``envs/programs/templates/families_library.py``) before it is
confined, and ``ValidationConfig(allowed_imports=PROGRAM_IMPORTS)`` lets the static checks
pass the import.
"""

from __future__ import annotations

from spade_jax.envs.contract import ALLOWED_IMPORTS as _STDLIB
from spade_jax.envs.families import FAMILIES, Family
from spade_jax.envs.program import env_class_name
from spade_jax.envs.programs import load_program

IMPORT_NAME = "families"
"""What a library program imports."""
PROGRAM_IMPORTS = _STDLIB + (IMPORT_NAME,)
"""``ValidationConfig.allowed_imports`` for library programs."""


def class_name(fam: Family) -> str:
  """The ``...Env`` class the family's body defines (the one the static checks pick)."""
  name = env_class_name(fam.body)
  if name is None:
    raise ValueError(f"family {fam.name!r}: its body defines no ...Env class")
  return name


def sandbox_module() -> tuple[str, str]:
  """(import name, source) of the module a sandbox worker builds: every family's body, and
  the ``Game`` base of the programs (``SandboxConfig.modules`` names this module)."""
  specs = {n: (class_name(f), f.knob_names, f.body) for n, f in FAMILIES.items()}
  return IMPORT_NAME, f"_SPECS = {specs!r}\n\n" + load_program("families_library")


def program(name: str, **knobs: int) -> str:
  """The library program of family ``name`` at ``knobs`` (others at medium): the title,
  knob lines and ``TURNS`` of ``FAMILIES[name].program(**knobs)``, then the thin class."""
  fam = FAMILIES[name]
  values = fam.resolve(**knobs)
  lines = [f'"""{fam.title}"""', "", f"from {IMPORT_NAME} import {name}", "",
           f"# Difficulty knobs of the {name!r} family."]
  for k in fam.knobs:
    lines.append(f"{k.name} = {values[k.name]!r}  # {k.doc}")
  lines.append(f"TURNS = {int(fam.turns(values))!r}  # turns the game allows")
  args = ", ".join(f"{k}={k}" for k in (*fam.knob_names, "TURNS"))
  lines += ["", "", f"class {class_name(fam)}({name}.Game):", "",
            "  def reset(self, seed=None, options=None):",
            f"    return self.start(seed, options, {args})", "",
            "  def step(self, action):", "    return self.move(action)"]
  return "\n".join(lines) + "\n"


def program_at(name: str, level: int | str) -> str:
  """The library program of family ``name`` at difficulty ``level``."""
  return program(name, **FAMILIES[name].levels(level))


__all__ = ["IMPORT_NAME", "PROGRAM_IMPORTS", "class_name", "program", "program_at",
           "sandbox_module"]
