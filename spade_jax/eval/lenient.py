r"""Lenient and strict answer reading for procedural tasks.

The readers are the library's one parser, :mod:`spade_jax.sandbox.worker.actions`
(standard library only), re-exported here as the same function objects: its whole source is
also the scoring code of the single-turn task programs (`selfplay.rlve.task_program` with
``scoring="lenient"``, via ``eval.answers.scoring_source()``), which run in the sandbox, so
the reward a program pays equals what held-out evaluation (`eval.procedural`) counts for
the same text.

Two readings of a completion (only the text after the last ``</think>`` counts):

- **strict**: the content of the last balanced ``\boxed{}``, the format every prompt
  asks for;
- **lenient**: the answer wherever it reasonably is: ``\boxed{}``, else
  ``<answer>...</answer>``, else the value after the last "answer is" / "answer:" /
  "result is" / "equals" phrase, else the text after the last "=", else the last number
  in the text.

Two answers are the same when their stripped texts are equal, or when both read as
numbers (commas, a leading "+", leading zeros and trailing ".0" tolerated, as
reasoning-gym's decimal scorer does) of equal value.
"""

from spade_jax.sandbox.worker.actions import (answer_tag, as_number, boxed, final_answer,
                                              last_boxed, lenient_answer, same_answer, score,
                                              strict_answer, visible_text)

__all__ = ["answer_tag", "as_number", "boxed", "final_answer", "last_boxed", "lenient_answer",
           "same_answer", "score", "strict_answer", "visible_text"]
