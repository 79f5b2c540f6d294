r"""AIME and GPQA-Diamond from local JSONL files in their published formats.

``aime``: rows ``{"problem" | "question": str, "answer": str | int, "id"?: ...}`` (the
Hugging Face AIME 2025/2026 exports); every file is a subset (``aime2025.jsonl`` ->
``aime2025/pass@1``). Checked with math-verify. Paper: 64 samples at T 1.0, pass@1.

``gpqa``: rows with the columns of the published GPQA CSV (``Question``, ``Correct
Answer``, ``Incorrect Answer 1..3``, ``Record ID``); the four options are shuffled once per
question by a hash of its text (the same order in every run). Paper: 8 samples at T 0.7,
avg@8 (reported as ``pass@1``: the mean correctness over all samples).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random

from spade_jax.eval import answers, data
from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, need, register
from spade_jax.eval.policy import texts

MATH_PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
GPQA_PROMPT = ("Answer the following multiple choice question. Think step by step, then give "
               "the letter of your final answer (one of A, B, C, D) within \\boxed{{}}.\n\n"
               "{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}")
AIME_FORMAT = '{"problem": "...", "answer": "..."} ("question" is accepted for "problem")'
GPQA_FORMAT = ('{"Question": ..., "Correct Answer": ..., "Incorrect Answer 1": ..., '
               '"Incorrect Answer 2": ..., "Incorrect Answer 3": ..., "Record ID": ...} '
               "(the columns of the published GPQA CSV)")


@dataclasses.dataclass(frozen=True)
class AIMEConfig(SuiteConfig):
  """``aime``: 64 samples at T 1.0 (docs/METHOD.md §8).

  Attributes:
    path: a JSONL file, a directory of them or a glob; "" reads ``aime*.jsonl`` under
      ``data_dir``.
    data_dir: directory of the local benchmark files.
  """

  samples: int = 64
  temperature: float = 1.0
  max_new_tokens: int = 32768
  path: str = ""
  data_dir: str = ""


@dataclasses.dataclass(frozen=True)
class GPQAConfig(SuiteConfig):
  """``gpqa``: GPQA-Diamond, 8 samples at T 0.7 (docs/METHOD.md §8).

  Attributes:
    path: the JSONL file; "" reads ``gpqa_diamond*.jsonl`` under ``data_dir``.
    data_dir: directory of the local benchmark files.
  """

  samples: int = 8
  temperature: float = 0.7
  max_new_tokens: int = 32768
  path: str = ""
  data_dir: str = ""


def _limit(rows: list, cfg: SuiteConfig) -> list:
  return rows[:cfg.limit] if cfg.limit else rows


def aime_items(cfg: AIMEConfig) -> list[dict]:
  """The selected problems: {"id", "subset" (file stem), "problem", "answer"}."""
  files = data.find_files("aime", cfg.path, cfg.data_dir, "aime*.jsonl",
                          "AIME problems as JSON lines")
  items = []
  for path in files:
    subset = os.path.splitext(os.path.basename(path))[0]
    for n, row in enumerate(data.read_jsonl(path, "aime", [("problem", "question", "Problem"),
                                                           ("answer", "Answer")], AIME_FORMAT)):
      items.append({"id": str(data.field(row, ("id", "ID", "problem_idx"), n)), "subset": subset,
                    "problem": data.field(row, ("problem", "question", "Problem")),
                    "answer": str(data.field(row, ("answer", "Answer")))})
  return _limit(items, cfg)


def _check_aime(cfg: AIMEConfig) -> None:
  need("math_verify", "math-verify", "aime")
  aime_items(cfg)


@register("aime", AIMEConfig, needs="local data",
          description="AIME problems (local JSONL), math-verify, pass@1", check=_check_aime)
def run_aime(policy, chat, cfg: AIMEConfig, *, pool=None, progress=None) -> SuiteResult:
  del pool
  items = aime_items(cfg)
  outs = texts(policy, chat, cfg, [MATH_PROMPT.format(problem=it["problem"]) for it in items],
               progress)
  records, by_subset = [], {}
  for it, samples in zip(items, outs):
    right = [answers.math_equal(it["answer"], t) for t in samples]
    score = mean([float(r) for r in right])
    by_subset.setdefault(it["subset"], []).append(score)
    records.append({"id": it["id"], "subset": it["subset"], "answer": it["answer"],
                    "pass@1": score, "correct": right,
                    "predictions": [answers.final_answer(t)[0] for t in samples],
                    "texts": [cfg.clip(t) for t in samples]})
  scores = {"pass@1": mean([r["pass@1"] for r in records])}
  if len(by_subset) > 1:
    scores.update({f"{s}/pass@1": mean(v) for s, v in by_subset.items()})
  return SuiteResult(scores, records)


def gpqa_options(row: dict) -> tuple[dict[str, str], str]:
  """(letter -> option, correct letter): the options in an order fixed by the question."""
  opts = [row["Correct Answer"]] + [row[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
  opts = [str(o).strip() for o in opts]
  order = list(range(4))
  seed = hashlib.sha256(str(row["Question"]).encode()).digest()
  random.Random(seed).shuffle(order)
  letters = "ABCD"
  return ({letters[j]: opts[i] for j, i in enumerate(order)}, letters[order.index(0)])


def gpqa_rows(cfg: GPQAConfig) -> list[dict]:
  """The selected rows of the GPQA file."""
  path = data.find_files("gpqa", cfg.path, cfg.data_dir, "gpqa_diamond*.jsonl",
                         "GPQA-Diamond questions as JSON lines")[0]
  fields = [("Question",), ("Correct Answer",), ("Incorrect Answer 1",),
            ("Incorrect Answer 2",), ("Incorrect Answer 3",)]
  return _limit(data.read_jsonl(path, "gpqa", fields, GPQA_FORMAT), cfg)


@register("gpqa", GPQAConfig, needs="local data",
          description="GPQA-Diamond (local JSONL), multiple choice, avg over samples",
          check=gpqa_rows)
def run_gpqa(policy, chat, cfg: GPQAConfig, *, pool=None, progress=None) -> SuiteResult:
  del pool
  rows = gpqa_rows(cfg)
  users, keys = [], []
  for row in rows:
    opts, key = gpqa_options(row)
    users.append(GPQA_PROMPT.format(question=str(row["Question"]).strip(), **opts))
    keys.append(key)
  outs = texts(policy, chat, cfg, users, progress)
  records = []
  for n, (row, key, samples) in enumerate(zip(rows, keys, outs)):
    picked = [answers.choice_letter(t) for t in samples]
    right = [p == key for p in picked]
    records.append({"id": str(row.get("Record ID", n)), "answer": key,
                    "pass@1": mean([float(r) for r in right]), "correct": right,
                    "predictions": picked, "texts": [cfg.clip(t) for t in samples]})
  return SuiteResult({"pass@1": mean([r["pass@1"] for r in records])}, records)
