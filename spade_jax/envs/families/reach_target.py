"""Reach a target number from a start number with a few allowed operations.

Difficulty: a longer shortest route, more operations to choose from, less slack over the
shortest route.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("reach_target")
_POOL = program_constant(_BODY, "POOL")
_WORK = load_program("reach_target_work")

FAMILY = Family(
    name="reach_target",
    skill="mathematical reasoning",
    title="Reach a target number from a start number with a few allowed operations.",
    knobs=(
        Knob("DEPTH", (2, 3, 4, 5, 6), 2, 8, "operations on the shortest route"),
        Knob("CHOICES", (2, 3, 3, 4, 4), 2, 5, "operations offered"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "turns beyond the shortest route"),
    ),
    body=_BODY,
    turns=lambda k: k["DEPTH"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(_POOL),
    work=_WORK,
)
