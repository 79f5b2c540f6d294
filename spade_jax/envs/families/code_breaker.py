"""Break a secret digit code from right-place / wrong-place feedback (Mastermind).

Secrets are drawn so that guessing, each turn, the first code that fits all feedback so
far finds the secret in exactly GUESSES guesses (fewer when 200 draws find no such
secret). A guess that contradicts earlier feedback wastes its turn. Difficulty: longer
codes and more digits to draw from (more codes fit the feedback), more guesses needed,
fewer guesses to spare.
"""

from spade_jax.envs.families.base import Family, Knob, change_letter
from spade_jax.envs.programs import load_program

_BODY = load_program("code_breaker")


def _check(k):
  # Guessing the first code that fits all feedback needs at most LENGTH + COLORS - 1
  # guesses (checked over every secret for LENGTH <= 4, COLORS <= 6).
  if k["GUESSES"] > k["LENGTH"] + k["COLORS"] - 1:
    return "GUESSES must be at most LENGTH + COLORS - 1"
  return None


def _perturb(rng, action, k):
  # A near miss: one digit of the intended guess changed.
  return change_letter(rng, action, "".join(str(d) for d in range(1, k["COLORS"] + 1)))


FAMILY = Family(
    name="code_breaker",
    skill="logical deduction",
    title="Break a secret digit code from right-place / wrong-place feedback.",
    knobs=(
        Knob("LENGTH", (3, 3, 4, 4, 4), 2, 4, "digits in the code"),
        Knob("COLORS", (3, 4, 4, 5, 6), 2, 6, "each digit is from 1 to COLORS"),
        Knob("GUESSES", (3, 4, 5, 6, 7), 1, 9, "guesses the scripted strategy needs"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "guesses beyond those"),
    ),
    body=_BODY,
    turns=lambda k: k["GUESSES"] + k["SLACK"],
    perturb=_perturb,
    check=_check,
)
