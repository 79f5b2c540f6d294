"""Environment memory: past programs with their verdicts and statistics.

Kept as the reference keeps it (docs/METHOD.md §3): at most 200 valid records, first in
first out; a prompt shows 2 exemplars of the same skill whose win rate lies in [0.15, 0.85],
drawn at random from the top ``max(3n, 10)`` by regret, and one negative of the same skill
(win rate > 0.9 or < 0.1). One deliberate departure: records of invalid programs (with the
validator's reason) are kept too, in their own FIFO of ``invalid_capacity``, and can be shown
as negatives; ``MemoryConfig.invalid_negatives=False`` switches back to the reference.

Random draws take an explicit seed (``random.Random(seed)``), so a resumed run shows what an
uninterrupted one would. Records are de-duplicated by a hash of the normalised code, so
re-submitting a program only merges statistics. The memory is saved atomically (temporary
file in the same directory, fsync, ``os.replace``), so a crash mid-write leaves the previous
file intact.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import random
import re
import tempfile
from typing import Any

from spade_jax.registry import names

# Version 2: MemoryConfig fields changed (version-1 files load; see EnvMemory.from_json).
_FORMAT_VERSION = 2
EVICTION_POLICIES = names("oldest", "lowest_reward", kind="memory eviction policy",
                          field="memory.eviction")
# Version-1 config fields that kept their meaning in version 2.
_V1_CONFIG_FIELDS = ("capacity", "eviction", "band_lo", "band_hi", "num_exemplars", "no_memory")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  """Environment-memory settings (defaults: the reference's, docs/METHOD.md §3).

  "Win rate" below is a record's ``win_rate_nohint``: the fraction of unhinted plays with
  reward > 0.

  Attributes:
    capacity: most valid records kept.
    eviction: which valid record goes when ``capacity`` is exceeded: ``"oldest"`` (first
      in, first out; a re-submitted program counts as new) or ``"lowest_reward"`` (lowest
      designer reward, oldest first among ties).
    band_lo: exemplars need a win rate >= band_lo ...
    band_hi: ... and <= band_hi.
    num_exemplars: exemplars shown per prompt (n).
    top_per_exemplar: exemplars are drawn at random from the top
      ``max(top_per_exemplar * n, top_min)`` in-band records by regret ...
    top_min: ... (see ``top_per_exemplar``).
    negative_hi: a valid record with win rate > negative_hi is a negative (too easy) ...
    negative_lo: ... and so is one with win rate < negative_lo (too hard).
    invalid_negatives: keep records of invalid programs (they carry the validator's
      reason) and show them as negatives. Departure from the reference, whose memory holds
      valid environments only; False switches back (invalid records are then neither
      stored nor shown).
    invalid_capacity: most invalid records kept (first in, first out), on top of
      ``capacity``.
    negatives: show one negative example per prompt (the reference). False shows none
      (records are still kept), for a prompt budget too small for a second program.
    no_memory: ablation switch; retrieval returns nothing (records are still kept).
  """
  capacity: int = 200
  eviction: str = "oldest"
  band_lo: float = 0.15
  band_hi: float = 0.85
  num_exemplars: int = 2
  top_per_exemplar: int = 3
  top_min: int = 10
  negative_hi: float = 0.9
  negative_lo: float = 0.1
  invalid_negatives: bool = True
  invalid_capacity: int = 64
  negatives: bool = True
  no_memory: bool = False

  def __post_init__(self):
    EVICTION_POLICIES.check(self.eviction)
    if self.capacity < 1 or self.invalid_capacity < 0:
      raise ValueError(f"MemoryConfig needs capacity >= 1 and invalid_capacity >= 0; got "
                       f"capacity={self.capacity}, invalid_capacity={self.invalid_capacity}.")
    if not 0.0 <= self.band_lo <= self.band_hi <= 1.0:
      raise ValueError(f"MemoryConfig band must satisfy 0 <= band_lo <= band_hi <= 1; got "
                       f"[{self.band_lo}, {self.band_hi}].")
    if not 0.0 <= self.negative_lo <= self.negative_hi <= 1.0:
      raise ValueError(f"MemoryConfig negative thresholds must satisfy 0 <= negative_lo <= "
                       f"negative_hi <= 1; got negative_lo={self.negative_lo}, "
                       f"negative_hi={self.negative_hi}.")
    if self.num_exemplars < 0 or self.top_per_exemplar < 1 or self.top_min < 1:
      raise ValueError(f"MemoryConfig needs num_exemplars >= 0, top_per_exemplar >= 1 and "
                       f"top_min >= 1; got {self.num_exemplars}, {self.top_per_exemplar}, "
                       f"{self.top_min}.")


def _strip_docstrings(tree: ast.AST) -> ast.AST:
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        node.body = body[1:] or [ast.Pass()]
  return tree


def code_hash(program: str) -> str:
  """Hash of the program that ignores comments, docstrings and formatting.

  Parses with ``ast``, drops docstrings and dumps the tree without positions. Programs
  that do not parse fall back to a whitespace- and comment-insensitive text hash.

  Args:
    program: Python source.

  Returns:
    A 16-hex-digit hash.
  """
  try:
    canon = ast.dump(_strip_docstrings(ast.parse(program)), include_attributes=False)
  except (SyntaxError, ValueError):
    lines = [re.sub(r"\s+", " ", ln.split("#", 1)[0]).strip() for ln in program.splitlines()]
    canon = "\x00unparsed\n" + "\n".join(ln for ln in lines if ln)
  return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


def _unparse(tree: ast.AST) -> str:
  """``ast.unparse`` with 2-space indentation (its string literals are single-line)."""
  text = ast.unparse(tree)
  return re.sub(r"^((?:    )+)", lambda m: "  " * (len(m.group(1)) // 4), text, flags=re.M)


def _outer_functions(node: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
  """Functions and methods not nested inside another function, in source order."""
  out = []
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
      out.append(child)
    else:
      out.extend(_outer_functions(child))
  return out


class ProgramRenderer:
  """Renderings of one program that never cut it mid-class, computed lazily and cached.

  The ladder, longest first: the program as written; without docstrings and comments
  (``elided(0)``); with the bodies of the first ``k`` functions of the elision order
  replaced by ``...`` (``elided(k)``): largest bodies first, ``__init__`` / ``reset`` /
  ``step`` last. Every rung parses as Python. Keep one renderer per program when fitting
  it to many budgets (the designer prompt's search does).

  Args:
    program: Python source.
  """

  def __init__(self, program: str):
    self.program = program
    try:
      self._tree = _strip_docstrings(ast.parse(program))
    except (SyntaxError, ValueError, RecursionError):
      self._tree = None
    self._funcs = _outer_functions(self._tree) if self._tree is not None else []
    self._bodies = [f.body for f in self._funcs]
    sizes = [(f.end_lineno or f.lineno) - f.lineno for f in self._funcs]  # Lines.
    core = {"reset", "step", "__init__"}
    self._order = sorted(range(len(self._funcs)),
                         key=lambda i: (self._funcs[i].name in core, -sizes[i], i))
    self._cache: dict[int, str] = {}

  @property
  def parses(self) -> bool:
    return self._tree is not None

  @property
  def num_functions(self) -> int:
    """Functions and methods that can be elided (not nested in another function)."""
    return len(self._funcs)

  def elided(self, k: int) -> str:
    """Without docstrings or comments, the first ``k`` bodies of the order elided."""
    if self._tree is None:
      raise ValueError("The program does not parse, so it has no elided rendering; check "
                       "ProgramRenderer.parses first.")
    if k not in self._cache:
      elide = set(self._order[:k])
      try:  # Swap bodies in place (a deep copy per rendering is much slower), then restore.
        for i, f in enumerate(self._funcs):
          f.body = [ast.Expr(ast.Constant(...))] if i in elide else self._bodies[i]
        self._cache[k] = _unparse(self._tree)
      finally:
        for f, body in zip(self._funcs, self._bodies):
          f.body = body
    return self._cache[k]

  def skeleton(self) -> str | None:
    """The shortest rendering (every body elided), or None if the program does not parse."""
    return self.elided(len(self._funcs)) if self._tree is not None else None

  def fit(self, max_chars: int) -> str | None:
    """The first rendering of the ladder within ``max_chars``, or None if none fits.

    Elides as few bodies as needed (binary search over the elision order).
    """
    if len(self.program) <= max_chars:
      return self.program.rstrip()
    if max_chars <= 0 or self._tree is None:
      return None
    if len(self.elided(0)) <= max_chars:
      return self.elided(0)
    n = len(self._funcs)
    if len(self.elided(n)) > max_chars:
      return None
    lo, hi = 0, n  # elided(lo) is too long; elided(hi) fits.
    while hi - lo > 1:
      mid = (lo + hi) // 2
      if len(self.elided(mid)) <= max_chars:
        hi = mid
      else:
        lo = mid
    return self.elided(hi)


def elided_program(program: str) -> str | None:
  """The program's skeleton: no docstrings or comments, every function body ``...``.

  The shortest rendering :func:`render_program` can produce; it still parses as Python.

  Args:
    program: Python source.

  Returns:
    The skeleton, or None if the program does not parse.
  """
  return ProgramRenderer(program).skeleton()


def render_program(program: str, max_chars: int) -> str | None:
  """Fits a program into ``max_chars`` without cutting it mid-class.

  Tries, in order: the program as written; without docstrings and comments; with function
  and method bodies replaced by ``...``, largest bodies first and ``__init__`` / ``reset``
  / ``step`` last, eliding as few as needed (binary search over that order). Every result
  parses as Python. See :class:`ProgramRenderer` to fit one program to many budgets.

  Args:
    program: Python source.
    max_chars: character budget.

  Returns:
    The rendered source, or None if even the fully elided skeleton
    (:func:`elided_program`) does not fit (or the program does not parse and is too long).
  """
  return ProgramRenderer(program).fit(max_chars)


@dataclasses.dataclass
class MemoryRecord:
  """One environment and what happened to it.

  Attributes:
    program: full source.
    doc_id: grounding document id ("" when ungrounded).
    skill: target skill.
    reason: machine-readable rejection reason, or None for a valid environment.
    win_rate_nohint: the record's win rate: the fraction of unhinted plays with reward > 0
      (the reference's definition). Filled in by the caller.
    win_rate_hint: the fraction of hinted plays with reward > 0. Filled in by the caller.
    regret: hinted mean reward minus unhinted mean reward at the regeneration step,
      unfloored (negative when the hint hurt). Filled in by the caller.
    designer_reward: the designer's reward for this program.
    iteration: self-play iteration that produced (or last re-produced) it.
    setting: ``"games"`` or ``"tool_use"``.
    code_hash: normalised-code hash (filled in automatically).
    count: how many times this program was submitted (statistics are averaged over them).
  """
  program: str
  doc_id: str = ""
  skill: str = ""
  reason: str | None = None
  win_rate_nohint: float = 0.0
  win_rate_hint: float = 0.0
  regret: float = 0.0
  designer_reward: float = 0.0
  iteration: int = 0
  setting: str = "games"
  code_hash: str = ""
  count: int = 1

  def __post_init__(self):
    if not self.code_hash:
      self.code_hash = code_hash(self.program)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> MemoryRecord:
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


_STATS = ("win_rate_nohint", "win_rate_hint", "regret", "designer_reward")


class EnvMemory:
  """A bounded, de-duplicated collection of :class:`MemoryRecord`.

  Valid records and records of invalid programs (``reason`` set) are capped separately
  (``capacity`` / ``invalid_capacity``); records are kept in insertion order, which is the
  FIFO order (a merged re-submission moves to the back).
  """

  def __init__(self, config: MemoryConfig | None = None,
               records: list[MemoryRecord] | None = None):
    self.config = config or MemoryConfig()
    self._records: dict[str, MemoryRecord] = {}
    for rec in records or ():
      self.add(rec)

  def __len__(self) -> int:
    return len(self._records)

  def __iter__(self):
    return iter(list(self._records.values()))

  def __contains__(self, program: str) -> bool:
    return code_hash(program) in self._records

  @property
  def records(self) -> list[MemoryRecord]:
    return list(self._records.values())

  def negative_reason(self, rec: MemoryRecord) -> str | None:
    """Why a record is a negative example, or None if it is not one.

    Invalid records (only with ``config.invalid_negatives``) give their rejection reason;
    valid ones are negatives when their win rate is above ``negative_hi`` (too easy) or
    below ``negative_lo`` (too hard).
    """
    c = self.config
    if rec.reason:
      return rec.reason if c.invalid_negatives else None
    if rec.win_rate_nohint > c.negative_hi:
      return f"too easy: the agent won {rec.win_rate_nohint:.0%} of plays without a hint"
    if rec.win_rate_nohint < c.negative_lo:
      return (f"too hard: the agent won only {rec.win_rate_nohint:.0%} of plays without a "
              "hint")
    return None

  def add(self, record: MemoryRecord) -> MemoryRecord | None:
    """Adds a record, or merges it into the record with the same normalised code.

    Merging averages the statistics weighted by ``count``, keeps the latest iteration and
    the latest verdict reason, and moves the record to the back of the FIFO.

    Args:
      record: the new record (not modified).

    Returns:
      The stored record, or None when it was not stored: an invalid record while
      ``config.invalid_negatives`` is False, or one evicted at once (``"lowest_reward"``
      eviction of a full memory).
    """
    if record.reason and not self.config.invalid_negatives:
      return None
    rec = dataclasses.replace(record)
    old = self._records.pop(rec.code_hash, None)
    if old is not None:
      total = old.count + rec.count
      for name in _STATS:
        merged = (getattr(old, name) * old.count + getattr(rec, name) * rec.count) / total
        setattr(old, name, merged)
      old.count = total
      if rec.iteration >= old.iteration:
        old.iteration, old.reason = rec.iteration, rec.reason
      rec = old
    self._records[rec.code_hash] = rec
    self._evict()
    return rec if rec.code_hash in self._records else None

  def _evict(self) -> None:
    c = self.config
    valid = [r for r in self._records.values() if not r.reason]
    invalid = [r for r in self._records.values() if r.reason]
    drop = invalid if not c.invalid_negatives else invalid[:max(0, len(invalid)
                                                                - c.invalid_capacity)]
    excess = len(valid) - c.capacity
    if excess > 0:
      if c.eviction == "lowest_reward":  # Stable sort: oldest first among ties.
        valid = sorted(valid, key=lambda r: r.designer_reward)
      drop = drop + valid[:excess]
    for r in drop:
      del self._records[r.code_hash]

  def exemplars(self, skill: str | None, k: int | None = None, *, setting: str | None = None,
                seed: int = 0) -> list[MemoryRecord]:
    """Positive exemplars: valid records of ``skill`` inside the win-rate band.

    ``k`` records are drawn without replacement, with ``random.Random(seed)``, from the top
    ``max(top_per_exemplar * k, top_min)`` by regret (ties: latest iteration first). Pass a
    different seed per prompt (e.g. a hash of run seed, iteration and slot) so that slots of
    the same skill see different exemplars, and the same seed on resume.

    Args:
      skill: the prompt's skill (only records of that skill qualify), or None for any.
      k: how many; default ``config.num_exemplars``.
      setting: restrict to a setting, or None for any.
      seed: seeds the random draw.

    Returns:
      Up to ``k`` records in draw order (none when ``config.no_memory``).
    """
    c = self.config
    k = c.num_exemplars if k is None else k
    if c.no_memory or k <= 0:
      return []
    pool = [r for r in self._records.values()
            if not r.reason and (skill is None or r.skill == skill)
            and (setting is None or r.setting == setting)
            and c.band_lo <= r.win_rate_nohint <= c.band_hi]
    pool.sort(key=lambda r: (-r.regret, -r.iteration, r.code_hash))
    top = pool[:max(c.top_per_exemplar * k, c.top_min)]
    return random.Random(seed).sample(top, min(k, len(top)))

  def negative(self, skill: str | None, *, setting: str | None = None,
               seed: int = 0) -> MemoryRecord | None:
    """One negative example of ``skill``, drawn with ``random.Random(seed)``, or None.

    Args:
      skill: the prompt's skill (only records of that skill qualify), or None for any.
      setting: restrict to a setting, or None for any.
      seed: seeds the random draw (see :meth:`exemplars`).

    Returns:
      A copy of the record with ``reason`` set to why it is a negative (see
      :meth:`negative_reason`), or None (always None when ``config.no_memory`` or not
      ``config.negatives``).
    """
    if self.config.no_memory or not self.config.negatives:
      return None
    pool = [r for r in self._records.values()
            if (skill is None or r.skill == skill) and (setting is None or r.setting == setting)
            and self.negative_reason(r)]
    if not pool:
      return None
    pool.sort(key=lambda r: (-r.iteration, r.code_hash))
    rec = random.Random(seed).choice(pool)
    return dataclasses.replace(rec, reason=self.negative_reason(rec))

  # -- persistence ---------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    return {"version": _FORMAT_VERSION, "config": dataclasses.asdict(self.config),
            "records": [r.to_dict() for r in self._records.values()]}

  @classmethod
  def from_json(cls, data: dict[str, Any], config: MemoryConfig | None = None) -> EnvMemory:
    """The memory of :meth:`to_json` (format version 1 or 2).

    Args:
      data: the JSON object.
      config: overrides the stored config. Version-1 files keep only the config fields
        whose meaning did not change (capacity, eviction, band, num_exemplars, no_memory);
        the rest take the current defaults.

    Returns:
      The memory, with the (new) config's capacities applied.
    """
    version = data.get("version")
    if version not in (1, _FORMAT_VERSION):
      raise ValueError(f"Environment memory format version {version!r} is not readable by "
                       f"this spade_jax (it reads versions 1 and {_FORMAT_VERSION}); start "
                       "a fresh memory or load it with the spade_jax version that wrote it.")
    if config is None:
      stored = data.get("config", {})
      if version == 1:
        stored = {k: v for k, v in stored.items() if k in _V1_CONFIG_FIELDS}
      config = MemoryConfig(**stored)
    mem = cls(config)
    for d in data["records"]:
      rec = MemoryRecord.from_dict(d)
      mem._records[rec.code_hash] = rec  # pylint: disable=protected-access
    mem._evict()  # pylint: disable=protected-access
    return mem

  def save(self, path: str) -> None:
    """Writes the memory as JSON atomically: the old file survives any crash mid-write.

    Args:
      path: destination file; its directory is created if missing. A remote path
        (``gs://...``) is written in one upload, which object stores make atomic.
    """
    if "://" in path:
      from etils import epath  # pylint: disable=g-import-not-at-top
      epath.Path(path).write_text(json.dumps(self.to_json()))
      return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(self.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, path)
    except BaseException:
      try:
        os.unlink(tmp)
      except OSError:
        pass
      raise
    try:
      dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
      return
    try:
      os.fsync(dir_fd)
    except OSError:
      pass
    finally:
      os.close(dir_fd)

  @classmethod
  def load(cls, path: str, config: MemoryConfig | None = None) -> EnvMemory:
    """Reads a memory written by :meth:`save`.

    Args:
      path: the file.
      config: overrides the saved config (e.g. to change capacity on resume).

    Returns:
      The memory.
    """
    if not os.path.exists(path):
      raise FileNotFoundError(f"No environment memory at {path!r}; start with EnvMemory() "
                              "or point to the file written by EnvMemory.save.")
    with open(path, encoding="utf-8") as f:
      try:
        data = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"Environment memory file {path!r} is not valid JSON ({e.msg}).") from e
    return cls.from_json(data, config)
