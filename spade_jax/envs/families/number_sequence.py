"""Continue a number sequence made by a hidden rule, one term per turn.

Difficulty: more kinds of rule (alternating steps, growing steps, doubling, sums of
the two previous terms), fewer terms shown, more terms to give and fewer wrong answers
allowed.
"""

from spade_jax.envs.families.base import Family, Knob, shift_int
from spade_jax.envs.programs import load_program

_BODY = load_program("number_sequence")
_WORK = load_program("number_sequence_work")

FAMILY = Family(
    name="number_sequence",
    skill="pattern recognition",
    title="Continue a number sequence made by a hidden rule, one term per turn.",
    knobs=(
        Knob("RULES", (1, 2, 3, 4, 5), 1, 5, "kinds of rule an instance may use"),
        Knob("SHOWN", (6, 6, 5, 5, 4), 4, 8, "terms shown"),
        Knob("ASKED", (2, 3, 4, 5, 6), 1, 8, "terms to give"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["ASKED"] + k["SLACK"],
    perturb=lambda rng, action, k: shift_int(rng, action, (-4, -2, -1, 1, 2, 4)),
    work=_WORK,
)
