"""Write a decimal number in another base, one digit per turn.

Difficulty: more digits, a larger base (harder divisions, more digits to choose from)
and fewer wrong answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program

_BODY = load_program("base_convert")
_WORK = load_program("base_convert_work")

FAMILY = Family(
    name="base_convert",
    skill="mathematical reasoning",
    title="Write a decimal number in another base, one digit per turn.",
    knobs=(
        Knob("DIGITS", (3, 4, 5, 6, 7), 2, 10, "digits of the number in the new base"),
        Knob("BASE", (2, 3, 5, 7, 8), 2, 9, "the base to write it in"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["DIGITS"] + k["SLACK"],
    perturb=lambda rng, action, k: str(rng.randrange(k["BASE"])),
    work=_WORK,
)
