"""Guess a secret integer from higher/lower feedback (the built-in guess_secret as a family).

Difficulty: a wider range needs more halvings, and less slack over the halving count
leaves less room for wasted guesses.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program

_BODY = load_program("guess_number")


def _turns(k):
  # Halving [1, HIGH] takes at most HIGH.bit_length() guesses.
  return k["HIGH"].bit_length() + k["SLACK"]


_WORK = load_program("guess_number_work")

FAMILY = Family(
    name="guess_number",
    skill="logical deduction",
    title="Guess a secret integer from higher/lower feedback.",
    knobs=(
        Knob("HIGH", (15, 31, 63, 127, 255), 7, 1023, "the secret is in [1, HIGH]"),
        Knob("SLACK", (3, 2, 2, 1, 1), 0, 6, "guesses beyond the halving worst case"),
    ),
    body=_BODY,
    turns=_turns,
    perturb=lambda rng, action, k: str(rng.randint(1, k["HIGH"])),
    work=_WORK,
)
