"""Environment memory: past programs with their verdicts and statistics.

The designer is shown positive exemplars (environments that sat at the edge of the agent's
ability, ranked by regret) and one negative example (an invalid, trivial or unsolvable
program with its reason). Records are de-duplicated by a hash of the normalised code, so
re-submitting a program only merges statistics. The memory is saved atomically (temporary
file in the same directory, fsync, ``os.replace``), so a crash mid-write leaves the previous
file intact.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import json
import os
import re
import tempfile
from typing import Any

from spade_jax.registry import names

_FORMAT_VERSION = 1
EVICTION_POLICIES = names("lowest_reward", "oldest", kind="memory eviction policy",
                          field="memory.eviction")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  """Environment-memory settings.

  Attributes:
    capacity: most records kept in total.
    negative_capacity: most negative records (invalid / trivial / unsolvable) kept.
    eviction: ``"lowest_reward"`` (drop the lowest designer reward, oldest first among
      ties) or ``"oldest"`` (drop the lowest iteration).
    band_lo: positive exemplars need an unhinted win rate >= band_lo ...
    band_hi: ... and <= band_hi.
    min_regret: ... and at least this regret.
    trivial_win_rate: a valid record with unhinted win rate >= this counts as trivial.
    num_exemplars: exemplars returned by default.
    no_memory: ablation switch; retrieval returns nothing (records are still kept).
  """
  capacity: int = 256
  negative_capacity: int = 64
  eviction: str = "lowest_reward"
  band_lo: float = 0.05
  band_hi: float = 0.85
  min_regret: float = 0.0
  trivial_win_rate: float = 0.95
  num_exemplars: int = 2
  no_memory: bool = False

  def __post_init__(self):
    EVICTION_POLICIES.check(self.eviction)
    if self.capacity < 1 or self.negative_capacity < 0:
      raise ValueError(f"MemoryConfig capacities must be positive; got capacity="
                       f"{self.capacity}, negative_capacity={self.negative_capacity}.")
    if not 0.0 <= self.band_lo <= self.band_hi <= 1.0:
      raise ValueError(f"MemoryConfig band must satisfy 0 <= band_lo <= band_hi <= 1; got "
                       f"[{self.band_lo}, {self.band_hi}].")


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


def render_program(program: str, max_chars: int) -> str | None:
  """Fits a program into ``max_chars`` without cutting it mid-class.

  Tries, in order: the program as written; without docstrings and comments; with function
  and method bodies replaced by ``...``, largest bodies first and ``__init__`` / ``reset``
  / ``step`` last, eliding as few as needed (binary search over that order). Every result
  parses as Python.

  Args:
    program: Python source.
    max_chars: character budget.

  Returns:
    The rendered source, or None if even the fully elided skeleton does not fit (or the
    program does not parse and is too long).
  """
  if len(program) <= max_chars:
    return program.rstrip()
  if max_chars <= 0:
    return None
  try:
    tree = _strip_docstrings(ast.parse(program))
  except (SyntaxError, ValueError, RecursionError):
    return None
  text = _unparse(tree)
  if len(text) <= max_chars:
    return text
  funcs = _outer_functions(tree)
  core = {"reset", "step", "__init__"}
  sizes = [(f.end_lineno or f.lineno) - f.lineno for f in funcs]  # Body length in lines.
  order = sorted(range(len(funcs)), key=lambda i: (funcs[i].name in core, -sizes[i], i))

  def render(k: int) -> str:
    elided = copy.deepcopy(tree)
    targets = _outer_functions(elided)
    for i in order[:k]:
      targets[i].body = [ast.Expr(ast.Constant(...))]
    return _unparse(elided)

  best = render(len(funcs))
  if len(best) > max_chars:
    return None
  lo, hi = 0, len(funcs)  # render(lo) is too long; render(hi) fits.
  while hi - lo > 1:
    mid = (lo + hi) // 2
    candidate = render(mid)
    if len(candidate) <= max_chars:
      hi, best = mid, candidate
    else:
      lo = mid
  return best


@dataclasses.dataclass
class MemoryRecord:
  """One environment and what happened to it.

  Attributes:
    program: full source.
    doc_id: grounding document id ("" when ungrounded).
    skill: target skill.
    reason: machine-readable rejection reason, or None for a valid environment.
    win_rate_nohint: mean unhinted reward in [0, 1].
    win_rate_hint: mean hinted reward in [0, 1].
    regret: win_rate_hint - win_rate_nohint (averaged over the credit window).
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
  """A bounded, de-duplicated collection of :class:`MemoryRecord`."""

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
    """Why a record is a negative example (invalid, trivial, unsolvable), or None."""
    if rec.reason:
      return rec.reason
    if rec.win_rate_nohint >= self.config.trivial_win_rate:
      return (f"too easy: the agent solved {rec.win_rate_nohint:.0%} of episodes without "
              "any hint")
    if rec.win_rate_hint <= 0.0 and rec.win_rate_nohint <= 0.0:
      return "unsolved: the agent never solved it, even with a hint"
    return None

  def add(self, record: MemoryRecord) -> MemoryRecord:
    """Adds a record, or merges it into the record with the same normalised code.

    Merging averages the statistics weighted by ``count``, keeps the latest iteration and
    the latest verdict reason.

    Args:
      record: the new record (not modified).

    Returns:
      The stored record.
    """
    rec = dataclasses.replace(record)
    old = self._records.get(rec.code_hash)
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
    return rec

  def _evict(self) -> None:
    c = self.config
    negatives = [r for r in self._records.values() if self.negative_reason(r)]
    if len(negatives) > c.negative_capacity:
      negatives.sort(key=lambda r: r.iteration)
      for r in negatives[:len(negatives) - c.negative_capacity]:
        del self._records[r.code_hash]
    excess = len(self._records) - c.capacity
    if excess > 0:
      if c.eviction == "oldest":
        key = lambda r: (r.iteration, r.designer_reward)  # pylint: disable=unnecessary-lambda-assignment
      else:
        key = lambda r: (r.designer_reward, r.iteration)  # pylint: disable=unnecessary-lambda-assignment
      for r in sorted(self._records.values(), key=key)[:excess]:
        del self._records[r.code_hash]

  def exemplars(self, skill: str | None = None, k: int | None = None,
                setting: str | None = None, max_chars: int | None = None) -> list[MemoryRecord]:
    """Positive exemplars: valid, inside the win-rate band, highest regret first.

    Records of ``skill`` come first; other skills of the same setting fill the rest.

    Args:
      skill: preferred skill, or None for any.
      k: how many; default ``config.num_exemplars``.
      setting: restrict to a setting, or None for any.
      max_chars: if set, only records that :func:`render_program` can fit into this many
        characters (whole, or with method bodies elided) are eligible.

    Returns:
      Up to ``k`` records (none when ``config.no_memory``).
    """
    c = self.config
    k = c.num_exemplars if k is None else k
    if c.no_memory or k <= 0:
      return []
    pool = [r for r in self._records.values()
            if not self.negative_reason(r) and (setting is None or r.setting == setting)
            and c.band_lo <= r.win_rate_nohint <= c.band_hi and r.regret >= c.min_regret]
    pool.sort(key=lambda r: (r.skill != skill, -r.regret, -r.designer_reward, -r.iteration,
                             r.code_hash))
    if max_chars is None:
      return pool[:k]
    picked = []
    for r in pool:
      if len(picked) == k:
        break
      if render_program(r.program, max_chars) is not None:
        picked.append(r)
    return picked

  def negative(self, skill: str | None = None, setting: str | None = None,
               seed: int = 0) -> MemoryRecord | None:
    """One negative example with its reason filled in, or None.

    Prefers records of ``skill``; among them rotates deterministically with ``seed`` so
    successive prompts show different failures.

    Args:
      skill: preferred skill, or None for any.
      setting: restrict to a setting, or None for any.
      seed: rotation index (e.g. the iteration).

    Returns:
      A copy of the record with ``reason`` set, or None (always None when
      ``config.no_memory``).
    """
    if self.config.no_memory:
      return None
    pool = [r for r in self._records.values()
            if self.negative_reason(r) and (setting is None or r.setting == setting)]
    if not pool:
      return None
    same = [r for r in pool if r.skill == skill]
    pool = sorted(same or pool, key=lambda r: (-r.iteration, r.code_hash))
    rec = pool[seed % len(pool)]
    return dataclasses.replace(rec, reason=self.negative_reason(rec))

  # -- persistence ---------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    return {"version": _FORMAT_VERSION, "config": dataclasses.asdict(self.config),
            "records": [r.to_dict() for r in self._records.values()]}

  @classmethod
  def from_json(cls, data: dict[str, Any], config: MemoryConfig | None = None) -> EnvMemory:
    if data.get("version") != _FORMAT_VERSION:
      raise ValueError(f"Environment memory format version {data.get('version')!r}; "
                       f"expected {_FORMAT_VERSION}.")
    config = config or MemoryConfig(**data.get("config", {}))
    mem = cls(config)
    for d in data["records"]:
      rec = MemoryRecord.from_dict(d)
      mem._records[rec.code_hash] = rec  # pylint: disable=protected-access
    mem._evict()  # pylint: disable=protected-access
    return mem

  def save(self, path: str) -> None:
    """Writes the memory as JSON atomically: the old file survives any crash mid-write.

    Args:
      path: destination file; its directory is created if missing.
    """
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
