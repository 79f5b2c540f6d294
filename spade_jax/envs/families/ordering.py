"""Recover a hidden height order from pairwise clues (the built-in ordering_puzzle).

The agent names the people from tallest to shortest, one per turn. Difficulty: more
people, clues worded both ways ("shorter than"), redundant distractor clues, fewer wrong
answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("ordering")
_NAMES = program_constant(_BODY, "NAMES")

FAMILY = Family(
    name="ordering",
    skill="logical deduction",
    title="Recover a hidden height order from pairwise clues, one person per turn.",
    knobs=(
        Knob("PEOPLE", (3, 4, 5, 6, 7), 3, 8, "people to order"),
        Knob("MIXED", (0, 0, 1, 1, 1), 0, 1, "1: clues also say 'shorter than'"),
        Knob("EXTRA", (0, 0, 1, 1, 2), 0, 4, "redundant clues implied by the others"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["PEOPLE"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(_NAMES[:k["PEOPLE"]]),
)
