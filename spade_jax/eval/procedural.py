r"""Procedural reasoning-gym tasks at a curriculum level, and the held-out suite over them.

:func:`generate` makes one problem of a reasoning-gym family at a level of its curriculum
(every knob at that level, or its hardest); the RLVE env source
(`selfplay.rlve`) writes such problems into single-turn env programs, and the
``procedural`` suite evaluates a policy on a fixed set of them that training never draws
(:func:`held_out_tasks`; `selfplay.rlve.RLVEConfig.held_out_items` excludes their
questions from training).

Scores (``eval.lenient`` reads the answers; the prompt asks for ``\boxed{}``):

- ``lenient`` / ``lenient@k``: pass@1 (mean over the ``samples`` completions of an item,
  then over items) and pass@k (some completion right) with the answer read wherever it
  reasonably is;
- ``strict`` / ``strict@k``: the same, counting only a right ``\boxed{}`` answer;
- ``format``: share of completions with a ``\boxed{}``;
- with ``greedy``, ``greedy/lenient`` and ``greedy/strict`` of one arg-max completion.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from spade_jax.eval import lenient
from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, need, register
from spade_jax.eval.policy import texts

PROMPT = "{question}\n\nPut your final answer within \\boxed{{}}."
HELD_OUT_STREAM = 0x484F  # the held-out items' seeds; training draws from other streams


def _reasoning_gym():
  return need("reasoning_gym.factory", "reasoning-gym", "procedural")


def check_family(name: str, scoring: str = "exact") -> str:
  """Returns ``name`` if it can be a task family; else raises saying why and what to do.

  A family is a reasoning-gym dataset with a curriculum (its difficulty knobs). Under
  ``scoring="exact"`` it must keep the default exact-match ``score_answer`` (which the
  env program reproduces); ``"lenient"`` reads answers with :mod:`eval.lenient`, whose
  numeric comparison covers the decimal scorers of the arithmetic families too.
  """
  from reasoning_gym.dataset import ProceduralDataset  # pylint: disable=g-import-not-at-top
  factory = _reasoning_gym()
  if name not in factory.DATASETS:
    raise ValueError(f"{name!r} is not a reasoning-gym dataset; pick one of "
                     f"{sorted(factory.DATASETS)[:12]}... (reasoning_gym.factory.DATASETS).")
  if not factory.has_curriculum(name):
    raise ValueError(f"reasoning-gym dataset {name!r} has no curriculum, so it has no "
                     "difficulty levels; drop it from the task families.")
  if (scoring == "exact"
      and factory.DATASETS[name][0].score_answer is not ProceduralDataset.score_answer):
    raise ValueError(f"reasoning-gym dataset {name!r} scores answers with its own "
                     "score_answer, which the exact-match env program does not reproduce; "
                     "drop it, or set scoring='lenient' (numeric answers compared by value).")
  return name


def max_level(family: str) -> int:
  """The hardest level of ``family``: its curriculum's longest attribute, minus one."""
  cur = _reasoning_gym().create_curriculum(family)
  return max(len(a.levels) for a in cur.attributes.values()) - 1


def generate(family: str, level: int, seed: int) -> dict[str, Any]:
  """One problem of ``family`` at ``level`` (each knob at that level, or its hardest).

  Returns:
    {"family", "level", "seed", "question", "answer"}.
  """
  factory = _reasoning_gym()
  from reasoning_gym.coaching.base_curriculum import (  # pylint: disable=g-import-not-at-top
      DefaultCurriculumContext, RangeAttributeMode)
  cur = factory.create_curriculum(family)
  cur.set_global_level(level)
  cfg = cur.generate_configuration(
      {"seed": seed, "size": 1},
      context=DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND))
  entry = factory.DATASETS[family][0](cfg)[0]
  return {"family": family, "level": level, "seed": seed,
          "question": str(entry["question"]), "answer": str(entry["answer"])}


def held_out_tasks(families: tuple[str, ...], level: int, n: int, seed: int = 0
                   ) -> list[dict[str, Any]]:
  """``n`` fixed problems, families round-robin, seeds from the held-out stream.

  The same arguments give the same problems on every machine; a problem whose question
  repeats an earlier one is replaced, so the ``n`` questions differ.
  """
  rng = np.random.default_rng([seed, HELD_OUT_STREAM])
  out, seen = [], set()
  for i in range(n):
    family = families[i % len(families)]
    for _ in range(256):
      task = generate(family, level, int(rng.integers(2 ** 31)))
      if task["question"] not in seen:
        break
    seen.add(task["question"])
    out.append(task)
  return out


@dataclasses.dataclass(frozen=True)
class ProceduralConfig(SuiteConfig):
  """``procedural``: held-out reasoning-gym problems at one curriculum level.

  Attributes:
    families: reasoning-gym dataset names (comma-separated string or tuple).
    level: curriculum level of every problem.
    items: problems (families round-robin).
    data_seed: picks the problems (:func:`held_out_tasks`); training excludes them when
      its ``rlve.held_out_items`` / ``rlve.held_out_seed`` match.
    system: the system turn, as ``selfplay.agent_system``: "default" (the games agent's
      system prompt, as in self-play), "none" (no system turn) or any other text.
    greedy: also score one arg-max completion per item.
  """

  families: tuple[str, ...] = ("chain_sum",)
  level: int = 0
  items: int = 96
  data_seed: int = 0
  system: str = "default"
  greedy: bool = True
  samples: int = 4
  temperature: float = 0.7
  max_new_tokens: int = 64

  def __post_init__(self):
    super().__post_init__()
    families = (tuple(f for f in self.families.split(",") if f)
                if isinstance(self.families, str) else tuple(self.families))
    object.__setattr__(self, "families", families)
    if not families or self.items < 1 or self.level < 0:
      raise ValueError(f"ProceduralConfig: families={families!r}, items={self.items}, "
                       f"level={self.level}; expected a family, items >= 1, level >= 0.")


def system_prompt(system: str) -> str | None:
  """The system turn a ``system`` setting names."""
  if system == "default":
    from spade_jax import designer  # pylint: disable=g-import-not-at-top
    return designer.agent_system_prompt("games")
  return None if system in ("none", "") else system


def _check(cfg: ProceduralConfig) -> None:
  need("reasoning_gym", "reasoning-gym", "procedural")
  for f in cfg.families:
    check_family(f, "lenient")


@register("procedural", ProceduralConfig, needs="offline (procedural)",
          description="held-out reasoning-gym problems at one level: lenient/strict pass@1, "
                      "pass@k", check=_check)
def run_procedural(policy, chat, cfg: ProceduralConfig, *, pool=None, progress=None
                   ) -> SuiteResult:
  del pool
  n = min(cfg.items, cfg.limit) if cfg.limit else cfg.items
  items = held_out_tasks(cfg.families, cfg.level, n, cfg.data_seed)
  users = [PROMPT.format(question=t["question"]) for t in items]
  system = system_prompt(cfg.system)
  outs = texts(policy, chat, cfg, users, progress, system=system)
  greedy = None
  if cfg.greedy:
    greedy = texts(policy, chat, dataclasses.replace(cfg, samples=1, temperature=0.0),
                   users, progress, system=system)
  records, acc = [], {k: [] for k in ("lenient", "strict", "lenient@k", "strict@k",
                                       "format", "greedy/lenient", "greedy/strict")}
  for i, (task, samples) in enumerate(zip(items, outs)):
    scored = [lenient.score(t, task["answer"]) for t in samples]
    for kind in ("lenient", "strict"):
      hits = [float(s[kind]) for s in scored]
      acc[kind].append(mean(hits))
      acc[f"{kind}@k"].append(float(any(hits)))
    acc["format"].append(mean([float(lenient.strict_answer(t) is not None) for t in samples]))
    record = {"id": f"{task['family']}/{task['level']}/{task['seed']}",
              "question": task["question"], "answer": task["answer"],
              "predictions": [s["answer"] for s in scored],
              "lenient": [s["lenient"] for s in scored],
              "strict": [s["strict"] for s in scored],
              "texts": [cfg.clip(t) for t in samples]}
    if greedy is not None:
      g = lenient.score(greedy[i][0], task["answer"])
      acc["greedy/lenient"].append(float(g["lenient"]))
      acc["greedy/strict"].append(float(g["strict"]))
      record["greedy"] = {"text": cfg.clip(greedy[i][0]), **g}
    records.append(record)
  scores = {k: mean(v) for k, v in acc.items() if v}
  return SuiteResult(scores, records)
