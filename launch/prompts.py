r"""Prints the rendered designer prompt of every skill of every setting.

  python -m launch.prompts [--max_chars=12000]

Each prompt carries a demo grounding document, a memory exemplar and a negative
example, so every section of the prompt shows.
"""

from absl import app
from absl import flags

from spade_jax import console

_MAX_CHARS = flags.DEFINE_integer("max_chars", 12_000, "Character budget of each prompt.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from spade_jax.designer import prompts  # pylint: disable=g-import-not-at-top
  try:
    text = prompts.render_all(_MAX_CHARS.value)
  except ValueError as e:  # a budget too small for the fixed parts
    raise console.BadInput(f"--max_chars={_MAX_CHARS.value}: {e}") from e
  print(text)


if __name__ == "__main__":
  console.run(main)
