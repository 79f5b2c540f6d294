"""Walk from S to G on a grid with walls, one move per turn (the built-in grid_walk).

Difficulty: a larger grid with more walls, a longer shortest route and less slack over
it.
"""

from spade_jax.envs.families.base import Family, Knob
from spade_jax.envs.programs import load_program

_BODY = load_program("grid_path")


def _check(k):
  if k["STEPS"] > k["SIZE"] * k["SIZE"] // 2:
    return "STEPS must be at most SIZE * SIZE // 2"
  return None


_WORK = load_program("grid_path_work")

FAMILY = Family(
    name="grid_path",
    skill="spatial reasoning",
    title="Walk from P to G on a grid with walls, one move per turn.",
    knobs=(
        Knob("SIZE", (4, 5, 5, 6, 7), 3, 9, "the grid is SIZE x SIZE"),
        Knob("WALLS", (10, 15, 20, 25, 30), 0, 40, "percent of cells that are walls"),
        Knob("STEPS", (3, 5, 7, 9, 11), 1, 16, "moves on the shortest route"),
        Knob("SLACK", (2, 2, 1, 1, 0), 0, 6, "turns beyond the shortest route"),
    ),
    body=_BODY,
    turns=lambda k: k["STEPS"] + k["SLACK"],
    perturb=lambda rng, action, k: rng.choice("UDLR"),
    check=_check,
    work=_WORK,
)
