"""Deduce who owns which pet from "owns" / "does not own" clues (an elimination grid).

Each person owns a different pet; the clues leave exactly one assignment. The agent
names each person's pet, in order, one per turn. Difficulty: more people, fewer direct
"owns" clues (more elimination), fewer wrong answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("pet_owners")
_NAMES = program_constant(_BODY, "NAMES")
_PETS = program_constant(_BODY, "PETS")

FAMILY = Family(
    name="pet_owners",
    skill="logical deduction",
    title="Deduce who owns which pet from 'owns' / 'does not own' clues.",
    knobs=(
        Knob("PEOPLE", (3, 4, 5, 6, 7), 3, 7, "people, each with a different pet"),
        Knob("GIVEN", (2, 1, 1, 0, 0), 0, 7, "direct 'owns' clues"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["PEOPLE"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(_PETS[:k["PEOPLE"]]),
    check=lambda k: ("GIVEN must be below PEOPLE" if k["GIVEN"] >= k["PEOPLE"] else None),
)
