"""Knights always tell the truth, knaves always lie: say who is which.

Each islander makes one statement; the statements have exactly one consistent
assignment. The agent names each islander's kind, in order, one per turn. Difficulty:
more islanders (more statements to combine) and fewer wrong answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("knights_knaves")
_NAMES = program_constant(_BODY, "NAMES")

FAMILY = Family(
    name="knights_knaves",
    skill="logical deduction",
    title="Knights always tell the truth, knaves always lie: say who is which.",
    knobs=(
        Knob("PEOPLE", (3, 4, 5, 6, 7), 3, 8, "islanders, one statement each"),
        Knob("SLACK", (2, 1, 1, 0, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["PEOPLE"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(("knight", "knave")),
)
