"""The contamination audit of the data path: programs, plays, hints and documents.

An :class:`Auditor` scores what reaches training against the index of held-out items
(:mod:`spade_jax.eval.contamination`) and hints also against their own ``solution()``
(:mod:`spade_jax.designer.hint_audit`). It is pure: each check returns a :class:`Note` and
changes nothing; the stage that calls it acts on ``note.drop``. The ``audit`` config
section (:class:`AuditConfig`) says what a flag means: ``mode="flag"`` (default) only
records it, ``"drop"`` asks the caller to leave the item out, ``"off"`` checks nothing
(and never builds the index)::

  auditor = Auditor.from_config(run_config)   # a RunConfig, or a mapping with `audit`/`eval`
  auditor.program(source) -> Note             # a designed program's source
  auditor.observations(texts) -> Note         # what its plays printed (the worst one)
  auditor.hint(text, solution_actions) -> Note  # index + literal/answer/sequence leaks
  auditor.document(text) -> Note              # a grounding document
  auditor.metrics(notes) -> dict              # per-iteration metrics (below)
  auditor.record(notes) -> dict               # a designer sample record's `audit` field
  Auditor.annotate(sample, notes) -> sample   # a frozen sample with `notes` added to its
                                              # `audit` field (that record format)
  decontaminate(corpus, auditor) -> corpus    # the corpus minus its flagged documents

The index loads on the first check (built once per machine, then read from its cache).
``auditor.seconds`` is the wall time its checks took so far, index loading included (the
stages report their share as ``time/audit``).

**Metrics** (:meth:`Auditor.metrics`): ``audit/checked/<kind>``, ``audit/flagged/<kind>``,
``audit/flagged/<kind>/<suite>``, ``audit/dropped/<kind>``,
``audit/hint/leaked_{literal,answer,sequence}`` and ``audit/hint/leak_rate`` (hints that
give the solution away, of the hints checked against one); kinds are :data:`KINDS`.

**The ``audit`` field of a ``designer_samples.jsonl`` record** (:meth:`Auditor.record`)::

  "audit": {"flagged": bool,               # some check on this sample flagged
            "dropped": bool,               # ... and the mode left something out
            "checked": {"<kind>": int},    # checks made, per kind
            "notes": [{"kind", "suite", "item", "matches", "overlap", "answer",
                       "leak", "reason", "dropped"}, ...]}   # the flagged notes only

``launch.audit`` reads this field when present, and scores the programs of ``memory.json``
itself (what a run records without it).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Iterable, Mapping, Sequence

from absl import logging

from spade_jax.designer.hint_audit import KINDS as LEAKS, audit_hint
from spade_jax.eval.contamination import IndexConfig, Match, load_index
from spade_jax.registry import names

MODES = names("flag", "drop", "off", kind="audit mode", field="audit.mode")
KINDS = ("program", "observation", "hint", "document")


@dataclasses.dataclass(frozen=True)
class AuditConfig:
  """The ``audit`` config section.

  Attributes:
    mode: "flag" (record flags), "drop" (the caller leaves flagged items out) or "off".
    suites: the suites whose items are indexed (comma-separated or a tuple; default: every
      offline suite, and the local ones that ``eval`` configures).
    min_matches: n-grams a text must share with an item to be flagged.
    hint_min_share, hint_min_actions: a hint listing at least this share and this many of
      its solution's actions in order leaks.
  """

  mode: str = "flag"
  suites: tuple[str, ...] = ()
  min_matches: int = 1
  hint_min_share: float = 0.6
  hint_min_actions: int = 3

  def __post_init__(self):
    MODES.check(self.mode)
    suites = (tuple(s for s in self.suites.split(",") if s) if isinstance(self.suites, str)
              else tuple(self.suites))
    object.__setattr__(self, "suites", suites)
    self.index_config()  # Checks suites and min_matches.
    if not 0 < self.hint_min_share <= 1 or self.hint_min_actions < 1:
      raise ValueError(f"audit.hint_min_share={self.hint_min_share}, hint_min_actions="
                       f"{self.hint_min_actions}; expected a share in (0, 1] and >= 1.")

  def index_config(self) -> IndexConfig:
    return IndexConfig(suites=self.suites, min_matches=self.min_matches)


@dataclasses.dataclass(frozen=True)
class Note:
  """One check's outcome.

  Attributes:
    kind: what was checked (:data:`KINDS`).
    flagged: it holds a held-out item, or (a hint) gives its solution away.
    suite: the matching item's suite ("" when none).
    item: the matching item's id.
    matches: n-grams shared with it.
    overlap: share of the item's n-grams the text holds.
    answer: the item's short answer is in the text too.
    leak: for a hint, how it gives the solution away ("literal", "answer", "sequence").
    reason: one line saying why it was flagged ("" when not).
    drop: the caller should leave it out (flagged under ``mode="drop"``).
  """

  kind: str
  flagged: bool = False
  suite: str = ""
  item: str = ""
  matches: int = 0
  overlap: float = 0.0
  answer: bool = False
  leak: str | None = None
  reason: str = ""
  drop: bool = False

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["dropped"] = d.pop("drop")
    del d["flagged"]
    return d


def _match_reason(m: Match) -> str:
  return (f"shares {m.matches} n-gram(s) ({100 * m.overlap:.0f}% of its text) with {m.suite} "
          f"item {m.item}" + (", and its answer" if m.answer else ""))


def _timed(check):
  """A check whose wall time is added to ``Auditor.seconds``."""

  @functools.wraps(check)
  def timed(self, *args, **kwargs):
    t0 = time.perf_counter()
    try:
      return check(self, *args, **kwargs)
    finally:
      self.seconds += time.perf_counter() - t0

  return timed


class Auditor:
  """Checks of the data path against the held-out items (see the module)."""

  def __init__(self, cfg: AuditConfig | None = None, eval_cfg=None, index=None):
    """Args:
      cfg: the ``audit`` section.
      eval_cfg: the run's ``EvalConfig`` (which items its suites hold out).
      index: an index to use (default: :func:`eval.contamination.load_index`, on first use).
    """
    self.cfg = cfg or AuditConfig()
    self.eval_cfg = eval_cfg
    self._index = index
    self.seconds = 0.0  # wall time of the checks so far (see the module)

  @classmethod
  def from_config(cls, config) -> Auditor:
    """An auditor from a ``RunConfig``, an :class:`AuditConfig`, or a mapping (or
    ConfigDict) with ``audit`` and ``eval`` sections."""
    if isinstance(config, AuditConfig):
      return cls(config)
    if hasattr(config, "audit") and isinstance(getattr(config, "audit"), AuditConfig):
      return cls(config.audit, getattr(config, "eval", None))
    from spade_jax.eval import EvalConfig  # pylint: disable=g-import-not-at-top
    get = lambda k: dict(config[k].to_dict() if hasattr(config[k], "to_dict") else config[k]
                         ) if k in config else {}
    audit, ev = get("audit"), get("eval")
    for key, value in list(ev.items()):
      if isinstance(value, list):
        ev[key] = tuple(value)
    return cls(AuditConfig(**audit), EvalConfig(**ev) if ev else None)

  @property
  def on(self) -> bool:
    return self.cfg.mode != "off"

  @property
  def index(self):
    """The held-out index (loaded or built on first use)."""
    if self._index is None:
      self._index = load_index(self.eval_cfg, self.cfg.index_config())
    return self._index

  def _note(self, kind: str, match: Match, leak=None) -> Note:
    flagged = match.flagged or bool(leak and leak.leaked)
    reasons = [_match_reason(match)] if match.flagged else []
    if leak is not None and leak.leaked:
      reasons.append(f"{leak.kind} leak: {leak.detail}")
    return Note(kind, flagged, match.suite if match.flagged else "",
                match.item if match.flagged else "", match.matches if match.flagged else 0,
                match.overlap if match.flagged else 0.0, match.answer and match.flagged,
                leak.kind if leak is not None and leak.leaked else None, "; ".join(reasons),
                flagged and self.cfg.mode == "drop")

  @_timed
  def text(self, kind: str, text: str | None) -> Note:
    """Any text, checked as ``kind``."""
    if kind not in KINDS:
      raise ValueError(f"Audit kind {kind!r}; expected one of {KINDS}.")
    if not self.on:
      return Note(kind)
    return self._note(kind, self.index.score(text))

  def program(self, source: str | None) -> Note:
    """A designed program's source."""
    return self.text("program", source)

  def document(self, text: str | None) -> Note:
    """A grounding document."""
    return self.text("document", text)

  @_timed
  def observations(self, texts: Iterable[str | None]) -> Note:
    """What a play printed: each observation is scored; the note is the worst one's."""
    if not self.on:
      return Note("observation")
    best = Match()
    for t in texts:
      m = self.index.score(t)
      if (m.flagged, m.matches, m.overlap) > (best.flagged, best.matches, best.overlap):
        best = m
    return self._note("observation", best)

  @_timed
  def hint(self, text: str | None, solution_actions: Sequence[str] | None = None) -> Note:
    """A hint: against the index, and (given its ``solution()``) for literal, answer and
    sequence leaks."""
    if not self.on:
      return Note("hint")
    leak = (audit_hint(text, solution_actions, self.cfg.hint_min_share,
                       self.cfg.hint_min_actions) if solution_actions else None)
    return self._note("hint", self.index.score(text), leak)

  def metrics(self, notes: Iterable[Note]) -> dict[str, float]:
    """Per-iteration metrics of ``notes`` (see the module)."""
    out: dict[str, float] = {}
    hints = leaked = 0
    for n in notes:
      out[f"audit/checked/{n.kind}"] = out.get(f"audit/checked/{n.kind}", 0) + 1
      out.setdefault(f"audit/flagged/{n.kind}", 0)
      if n.flagged:
        out[f"audit/flagged/{n.kind}"] += 1
        if n.suite:
          key = f"audit/flagged/{n.kind}/{n.suite}"
          out[key] = out.get(key, 0) + 1
      if n.drop:
        out[f"audit/dropped/{n.kind}"] = out.get(f"audit/dropped/{n.kind}", 0) + 1
      if n.kind == "hint":
        hints += 1
        if n.leak:
          leaked += 1
          key = f"audit/hint/leaked_{n.leak}"
          out[key] = out.get(key, 0) + 1
    if hints:
      for kind in LEAKS:
        out.setdefault(f"audit/hint/leaked_{kind}", 0)
      out["audit/hint/leak_rate"] = leaked / hints
    return {k: float(v) for k, v in out.items()}

  @staticmethod
  def record(notes: Iterable[Note]) -> dict[str, Any]:
    """The ``audit`` field of a designer sample's record (see the module)."""
    notes = list(notes)
    checked: dict[str, int] = {}
    for n in notes:
      checked[n.kind] = checked.get(n.kind, 0) + 1
    flagged = [n for n in notes if n.flagged]
    return {"flagged": bool(flagged), "dropped": any(n.drop for n in flagged),
            "checked": checked, "notes": [n.to_dict() for n in flagged]}

  @staticmethod
  def merge(audit: Mapping[str, Any] | None, notes: Iterable[Note]) -> dict[str, Any]:
    """``audit`` (a record's ``audit`` field, or None) with ``notes`` added."""
    new = Auditor.record(notes)
    if not audit:
      return new
    checked = dict(audit["checked"])
    for kind, n in new["checked"].items():
      checked[kind] = checked.get(kind, 0) + n
    return {"flagged": bool(audit["flagged"] or new["flagged"]),
            "dropped": bool(audit["dropped"] or new["dropped"]), "checked": checked,
            "notes": list(audit["notes"]) + new["notes"]}

  @staticmethod
  def annotate(sample, notes: Iterable[Note]):
    """A frozen sample (with an ``audit`` field, e.g. ``selfplay.state.DesignSample``)
    with ``notes`` added to it; ``sample`` itself when there are none."""
    notes = list(notes)
    if not notes:
      return sample
    return dataclasses.replace(sample, audit=Auditor.merge(sample.audit, notes))


class DecontaminatedCorpus:
  """A corpus that skips the documents its auditor flagged when it was made.

  The order, :meth:`state` and :meth:`restore` are the wrapped corpus's, so a run resumes
  where it was; ``removed`` holds the notes of the skipped documents (by id).
  """

  def __init__(self, corpus, auditor: Auditor):
    self.corpus = corpus
    self.removed: dict[str, Note] = {}
    for i in range(len(corpus)):
      doc = corpus.get(i)
      note = auditor.document(doc.text)
      if note.flagged:
        self.removed[doc.id] = note
    if len(self.removed) == len(corpus):
      raise ValueError(f"Every one of the corpus's {len(corpus)} documents holds a held-out "
                       "item; use another corpus or set corpus.decontaminate=False.")
    logging.info("corpus.decontaminate: %d of %d documents hold a held-out item and are "
                 "skipped%s", len(self.removed), len(corpus),
                 "".join(f"; {d}: {n.reason}" for d, n in list(self.removed.items())[:5]))

  def next(self):
    """The wrapped corpus's next document that was not flagged."""
    for _ in range(len(self.corpus) + 1):
      doc = self.corpus.next()
      if doc.id not in self.removed:
        return doc
    raise AssertionError("unreachable: some document is kept")

  def __len__(self) -> int:
    return len(self.corpus)

  def __getattr__(self, name):
    return getattr(self.corpus, name)


def decontaminate(corpus, auditor: Auditor):
  """``corpus`` without its flagged documents, checked once now (``corpus.decontaminate``);
  ``corpus`` itself when the auditor is off."""
  return DecontaminatedCorpus(corpus, auditor) if auditor.on else corpus


def filter_documents(docs: Iterable[Any], auditor: Auditor) -> tuple[list[Any], list[Note]]:
  """(kept documents, notes of the flagged ones) of ``docs`` (objects with ``.text``, or
  strings)."""
  kept, flagged = [], []
  for d in docs:
    note = auditor.document(d if isinstance(d, str) else d.text)
    (flagged if note.flagged else kept).append(note if note.flagged else d)
  return kept, flagged


def summarise(notes: Sequence[Note]) -> Mapping[str, int]:
  """Flagged notes per ``<kind>/<suite>``."""
  out: dict[str, int] = {}
  for n in notes:
    if n.flagged:
      key = f"{n.kind}/{n.suite or n.leak or '-'}"
      out[key] = out.get(key, 0) + 1
  return out


__all__ = ["AuditConfig", "Auditor", "DecontaminatedCorpus", "KINDS", "MODES", "Note",
           "decontaminate", "filter_documents", "summarise"]
