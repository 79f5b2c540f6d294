"""Rank people by their coins after a ledger of transfers (the held-out family).

Built only from what the seen families already ask for: the answers are `ordering`'s
names, one per turn from the most coins to the fewest, and every step of the bookkeeping
is an `arithmetic_chain`-sized sum or difference. Difficulty: more people, more transfers,
larger amounts, fewer wrong answers allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("coin_ledger")
_NAMES = program_constant(_BODY, "NAMES")

FAMILY = Family(
    name="coin_ledger",
    skill="mathematical reasoning",
    title="Rank people by their coins after a ledger of transfers, one person per turn.",
    knobs=(
        Knob("PEOPLE", (3, 3, 4, 5, 6), 3, 8, "people to rank"),
        Knob("TRANSFERS", (2, 3, 4, 6, 8), 1, 12, "transfers in the ledger"),
        Knob("MAX_AMOUNT", (5, 9, 12, 20, 30), 3, 50, "largest amount moved at once"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["PEOPLE"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice(_NAMES[:k["PEOPLE"]]),
)
