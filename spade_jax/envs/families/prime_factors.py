"""Factor a number into primes, one prime factor per turn.

Difficulty: more prime factors (a longer answer), larger primes, fewer wrong answers
allowed.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program, program_constant

_BODY = load_program("prime_factors")
_PRIMES = program_constant(_BODY, "PRIMES")
_WORK = load_program("prime_factors_work")

FAMILY = Family(
    name="prime_factors",
    skill="mathematical reasoning",
    title="Factor a number into primes, one prime factor per turn.",
    knobs=(
        Knob("FACTORS", (2, 3, 4, 5, 6), 2, 8, "prime factors, counted with multiplicity"),
        Knob("MAX_PRIME", (7, 11, 13, 17, 23), 3, 47, "largest prime that may appear"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "wrong answers allowed"),
    ),
    body=_BODY,
    turns=lambda k: k["FACTORS"] + k["SLACK"],
    perturb=lambda rng, action, k: str(rng.choice([p for p in _PRIMES if p <= k["MAX_PRIME"]])),
    work=_WORK,
)
