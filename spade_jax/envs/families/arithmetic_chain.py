"""Track a running value through a chain of operations (the built-in running_total).

Difficulty: more operations, larger operands and multiplication, and fewer wrong answers
allowed.
"""

from spade_jax.envs.families.base import Family, Knob, shift_int
from spade_jax.envs.programs import load_program

_BODY = load_program("arithmetic_chain")
_WORK = load_program("arithmetic_chain_work")

FAMILY = Family(
    name="arithmetic_chain",
    skill="mathematical reasoning",
    title="Track a running value through a chain of arithmetic operations.",
    knobs=(
        Knob("NUM_OPS", (3, 4, 6, 7, 8), 3, 12, "operations in the chain"),
        Knob("MAX_OPERAND", (9, 12, 20, 30, 50), 3, 99, "largest added or subtracted number"),
        Knob("MULTIPLY", (0, 1, 1, 1, 1), 0, 1, "1: some operations multiply by 2 or 3"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["NUM_OPS"] + k["SLACK"],
    perturb=lambda rng, action, k: shift_int(rng, action, (-10, -2, -1, 1, 2, 10)),
    work=_WORK,
)
