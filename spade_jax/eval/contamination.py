"""An index of the held-out items, for checking text that reaches training against it.

SPADE's claim is a held-out gain, so nothing the agent trains on may hold a held-out item.
:class:`Index` holds every offline suite's items (:mod:`eval.heldout`) as hashed word
n-grams, and :meth:`Index.score` says whether a text (a designed program, what it prints, a
hint, a grounding document) shares one with an item, which item, and how much of it.

How text becomes keys:

- words: the text lowercased and split at anything that is not a letter or a digit; the
  operators ``+ - * / = < > ^ %`` are words of their own ("0 - 3" is not "0 + 3");
- a segment (a question, a user turn, a docstring) of at least ``n`` words (13, the usual
  choice for decontamination) gives its word ``n``-grams; one of ``whole_min`` ..
  ``whole_max`` words (8-12) is one key as a whole, so a short question is still caught;
  shorter segments give none. N-grams never cross a segment boundary;
- ignored, as they say nothing about an item: n-grams of more than ``max_items`` items
  (a suite's boilerplate) and low-information ones: every word one character (a grid of
  digits), fewer than 4 distinct words, or fewer than 4 content words, where operators
  and the numbers of a run of 5 or more that is an arithmetic progression (``1 2 3 ..``)
  or consecutive terms of a well-known sequence (primes, squares, cubes, Fibonacci
  numbers, powers of two, factorials, triangular numbers) are not content: a program that
  lists the primes is not HumanEval/96, whose tests do;
- a key is a 64-bit polynomial hash of the words' 64-bit BLAKE2b hashes and the length.

A text matches an item when it holds at least ``min_matches`` of the item's keys; the best
item is the one it shares most keys with, ``overlap`` the share of that item's keys it
holds, and ``answer`` says whether the item's short normalised answer (suites with short
answers) is in the text too.

The index is built once (tens of seconds: most of it generates the Reasoning Gym tasks) and
cached as ``$SPADE_JAX_CACHE/contamination/<digest>.npz``, written atomically; the digest
covers the index settings, each suite's item settings, package versions and the SHA-256 of
every data file the items are read from (:func:`heldout.sources`), so a changed suite or
package builds a new one. :func:`load_index` returns it (kept in memory per process too).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Sequence

from absl import logging
import numpy as np

from spade_jax.eval import heldout

VERSION = 1
_WORD = re.compile(r"[^\W_]+|[-+*/=<>^%]")
_OPERATOR = re.compile(r"[-+*/=<>^%]")
_P = np.uint64(0x100000001B3)
_SALT = np.uint64(0x9E3779B97F4A7C15)
_MEMO: dict[str, "Index"] = {}


@dataclasses.dataclass(frozen=True)
class IndexConfig:
  """How the index is made.

  Attributes:
    n: words per n-gram.
    whole_min, whole_max: a segment of this many words is one key as a whole.
    max_items: an n-gram of more items than this is boilerplate and ignored.
    min_matches: keys a text must share with an item to match it.
    suites: which suites (default: every offline suite whose package is installed, and the
      local ones that are configured).
  """

  n: int = 13
  whole_min: int = 8
  whole_max: int = 12
  max_items: int = 4
  min_matches: int = 1
  suites: tuple[str, ...] = ()

  def __post_init__(self):
    suites = (tuple(s for s in self.suites.split(",") if s) if isinstance(self.suites, str)
              else tuple(self.suites))
    object.__setattr__(self, "suites", suites)
    for s in suites:
      if s not in heldout.READERS:
        raise ValueError(f"Contamination index: unknown suite {s!r}; expected some of "
                         f"{sorted(heldout.READERS)}.")
    if not 0 < self.whole_min <= self.whole_max < self.n or self.max_items < 1 or \
        self.min_matches < 1:
      raise ValueError(f"IndexConfig(n={self.n}, whole_min={self.whole_min}, whole_max="
                       f"{self.whole_max}, max_items={self.max_items}, min_matches="
                       f"{self.min_matches}); expected 0 < whole_min <= whole_max < n and "
                       "max_items, min_matches >= 1.")


@dataclasses.dataclass(frozen=True)
class Match:
  """How a text compares with the index.

  Attributes:
    flagged: it matches a held-out item.
    suite: the best item's suite ("" when none).
    item: the best item's id ("" when none).
    matches: keys shared with the best item.
    overlap: share of the best item's keys the text holds, in [0, 1].
    answer: the best item's short answer is in the text too.
    items: how many items share at least one key with the text.
  """

  flagged: bool = False
  suite: str = ""
  item: str = ""
  matches: int = 0
  overlap: float = 0.0
  answer: bool = False
  items: int = 0

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def words(text: str) -> list[str]:
  """``text`` lowercased and split at anything that is not a letter, a digit or an
  operator (each operator character is a word)."""
  return _WORD.findall(str(text).lower())


@functools.lru_cache(maxsize=1 << 20)
def _word_hash(word: str) -> int:
  return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def word_hashes(toks: Sequence[str]) -> np.ndarray:
  """One 64-bit hash per word."""
  return np.fromiter((_word_hash(w) for w in toks), np.uint64, len(toks))


def gram_hashes(wh: np.ndarray, n: int) -> np.ndarray:
  """The key of every ``n``-word window of the word hashes ``wh``."""
  m = len(wh) - n + 1
  if m <= 0:
    return np.zeros(0, np.uint64)
  h = np.zeros(m, np.uint64)
  with np.errstate(over="ignore"):
    for j in range(n):
      h = h * _P + wh[j:j + m]
    return h ^ (np.uint64(n) * _SALT)


def _known_sequences() -> list[list[int]]:
  primes, sieve = [], np.ones(20_000, bool)
  for p in range(2, 20_000):
    if sieve[p]:
      primes.append(p)
      sieve[p * p::p] = False
  fib = [0, 1]
  while len(fib) < 90:
    fib.append(fib[-1] + fib[-2])
  fact = [1]
  for k in range(1, 21):
    fact.append(fact[-1] * k)
  return [primes, fib, fact, [k * k for k in range(1001)], [k ** 3 for k in range(201)],
          [2 ** k for k in range(64)], [k * (k + 1) // 2 for k in range(1001)]]


@functools.lru_cache(maxsize=None)
def _known_positions() -> tuple[dict[int, int], ...]:
  """Per well-known sequence: value -> its position in the sequence."""
  return tuple({v: i for i, v in enumerate(seq)} for seq in _known_sequences())


def _sequence_runs(toks: Sequence[str], min_run: int = 5) -> np.ndarray:
  """Per word: whether it is in a run of at least ``min_run`` numbers (operators between
  them skipped) that is an arithmetic progression or consecutive terms of a well-known
  sequence."""
  out = np.zeros(len(toks), bool)
  nums = [(i, int(w)) for i, w in enumerate(toks) if w.isdigit() and len(w) <= 18]
  # Maximal stretches of numbers with nothing but operators between them.
  stretches, cur = [], []
  for i, v in nums:
    if cur and any(not _OPERATOR.fullmatch(t) for t in toks[cur[-1][0] + 1:i]):
      stretches.append(cur)
      cur = []
    cur.append((i, v))
  stretches.append(cur)
  for st in stretches:
    if len(st) < min_run:
      continue
    idx, v = [i for i, _ in st], [x for _, x in st]
    # A link at j joins word j to the run before it: equal steps (span 2), or the next
    # term of a well-known sequence (span 1).
    tests = [(2, [j >= 2 and v[j] - v[j - 1] == v[j - 1] - v[j - 2] for j in range(len(v))])]
    tests += [(1, [j >= 1 and pos.get(v[j], -2) == pos.get(v[j - 1], -9) + 1
                   for j in range(len(v))]) for pos in _known_positions()]
    for span, link in tests:
      j = 0
      while j < len(v):
        if not link[j]:
          j += 1
          continue
        a = j
        while j < len(v) and link[j]:
          j += 1
        if j - a + span >= min_run:
          out[idx[a - span:j]] = True
  return out


def _informative(toks: Sequence[str], wh: np.ndarray, k: int) -> np.ndarray:
  """Per ``k``-word window: False when it says nothing about an item (see the module)."""
  from numpy.lib.stride_tricks import sliding_window_view  # pylint: disable=g-import-not-at-top
  win = sliding_window_view(wh, k)
  distinct = 1 + (np.diff(np.sort(win, axis=1), axis=1) != 0).sum(axis=1)
  single = sliding_window_view(np.fromiter((len(w) == 1 for w in toks), bool, len(toks)), k)
  plain = ~_sequence_runs(toks) & np.fromiter((not _OPERATOR.fullmatch(w) for w in toks),
                                              bool, len(toks))
  content = sliding_window_view(plain, k).sum(axis=1)
  return (distinct >= 4) & ~single.all(axis=1) & (content >= 4)


def segment_keys(text: str, cfg: IndexConfig) -> np.ndarray:
  """The index keys of one segment of an item (unique and informative)."""
  toks = words(text)
  if len(toks) >= cfg.n:
    k = cfg.n
  elif len(toks) >= cfg.whole_min:
    k = len(toks)
  else:
    return np.zeros(0, np.uint64)
  wh = word_hashes(toks)
  return np.unique(gram_hashes(wh, k)[_informative(toks, wh, k)])


def text_keys(text: str, cfg: IndexConfig) -> tuple[list[str], np.ndarray]:
  """A checked text's words and every key it could share: its ``n``-grams and its windows
  of ``whole_min`` .. ``whole_max`` words."""
  toks = words(text)
  wh = word_hashes(toks)
  keys = [gram_hashes(wh, k) for k in [cfg.n] + list(range(cfg.whole_min, cfg.whole_max + 1))]
  return toks, np.unique(np.concatenate(keys))


def normalise_answer(answer: str | None) -> str:
  """A short answer as words ("" when it is absent, longer than 8 words or 64 characters,
  or a lone digit, which would be found anywhere)."""
  if answer is None:
    return ""
  answer = str(answer).strip()
  toks = words(answer)
  if not toks or len(toks) > 8 or len(answer) > 64 or (len(toks) == 1 and len(toks[0]) == 1):
    return ""
  return " ".join(toks)


def _contains(toks: Sequence[str], phrase: str) -> bool:
  return bool(phrase) and f" {phrase} " in f" {' '.join(toks)} "


class Index:
  """Held-out items as keys; :meth:`score` checks a text against them."""

  def __init__(self, cfg: IndexConfig, keys: np.ndarray, owner: np.ndarray,
               suites: Sequence[str], ids: Sequence[str], answers: Sequence[str],
               digest: str = ""):
    self.cfg, self.digest = cfg, digest
    self.keys, self.owner = keys, owner
    self.suites, self.ids, self.answers = list(suites), list(ids), list(answers)
    self.totals = np.bincount(owner, minlength=len(self.ids)) if len(ids) else np.zeros(0)

  @classmethod
  def build(cls, items: Sequence[heldout.Item], cfg: IndexConfig, digest: str = "") -> Index:
    """An index of ``items`` (boilerplate n-grams dropped)."""
    all_keys, all_owner = [], []
    for i, item in enumerate(items):
      segs = [segment_keys(s, cfg) for s in item.segments]
      keys = np.unique(np.concatenate(segs)) if segs else np.zeros(0, np.uint64)
      if item.shared:
        keys = keys[~np.isin(keys, np.concatenate([segment_keys(s, cfg)
                                                   for s in item.shared]))]
      all_keys.append(keys)
      all_owner.append(np.full(len(keys), i, np.int32))
    keys = np.concatenate(all_keys) if all_keys else np.zeros(0, np.uint64)
    owner = np.concatenate(all_owner) if all_owner else np.zeros(0, np.int32)
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    keep = counts[inverse] <= cfg.max_items
    keys, owner = keys[keep], owner[keep]
    order = np.argsort(keys, kind="stable")
    del uniq
    return cls(cfg, keys[order], owner[order], [it.suite for it in items],
               [it.id for it in items], [normalise_answer(it.answer) for it in items], digest)

  def __len__(self) -> int:
    return len(self.ids)

  def counts(self) -> dict[str, int]:
    """Suite -> items indexed."""
    out: dict[str, int] = {}
    for s in self.suites:
      out[s] = out.get(s, 0) + 1
    return out

  def score(self, text: str | None) -> Match:
    """How ``text`` compares with the held-out items (see :class:`Match`)."""
    if not text or not len(self.keys):
      return Match()
    toks, q = text_keys(text, self.cfg)
    left = np.searchsorted(self.keys, q, "left")
    hits = np.searchsorted(self.keys, q, "right") - left
    total = int(hits.sum())
    if not total:
      return Match()
    starts = np.repeat(left, hits) + np.arange(total) - np.repeat(np.cumsum(hits) - hits, hits)
    owners, counts = np.unique(self.owner[starts], return_counts=True)
    best = int(owners[np.argmax(counts)])  # Ties: the first item (np.unique sorts).
    matches = int(counts.max())
    return Match(flagged=matches >= self.cfg.min_matches, suite=self.suites[best],
                 item=self.ids[best], matches=matches,
                 overlap=float(matches / max(1, self.totals[best])),
                 answer=_contains(toks, self.answers[best]), items=len(owners))

  def find(self, suite: str, item: str) -> int:
    """The position of an item; raises naming the suite's first ids when absent."""
    for i, (s, d) in enumerate(zip(self.suites, self.ids)):
      if s == suite and d == item:
        return i
    ids = [d for s, d in zip(self.suites, self.ids) if s == suite][:5]
    raise KeyError(f"No item {item!r} of suite {suite!r} in the index (first ids: {ids}).")

  # -- persistence ---------------------------------------------------------------------

  def save(self, path: str) -> None:
    """Writes the index to ``path`` atomically (a temporary file, then a rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".tmp", dir=directory)
    try:
      with os.fdopen(fd, "wb") as f:
        np.savez(f, keys=self.keys, owner=self.owner, suites=np.array(self.suites, str),
                 ids=np.array(self.ids, str), answers=np.array(self.answers, str),
                 config=np.array(json.dumps(dataclasses.asdict(self.cfg))),
                 digest=np.array(self.digest))
      os.replace(tmp, path)
    except BaseException:
      try:
        os.unlink(tmp)
      except OSError:
        pass
      raise

  @classmethod
  def load(cls, path: str) -> Index:
    """Reads an index written by :meth:`save`."""
    with np.load(path, allow_pickle=False) as z:
      cfg = IndexConfig(**json.loads(str(z["config"])))
      return cls(cfg, z["keys"], z["owner"], [str(s) for s in z["suites"]],
                 [str(s) for s in z["ids"]], [str(s) for s in z["answers"]], str(z["digest"]))


def cache_dir() -> str:
  """``$SPADE_JAX_CACHE/contamination`` (default ``~/.cache/spade_jax/contamination``)."""
  root = os.environ.get("SPADE_JAX_CACHE") or os.path.join("~", ".cache", "spade_jax")
  return os.path.join(os.path.expanduser(root), "contamination")


def suite_configs(eval_cfg=None, cfg: IndexConfig | None = None) -> dict[str, Any]:
  """Suite -> config of the suites the index covers (:func:`heldout.configs`, narrowed
  to ``cfg.suites`` and to the offline suites whose package is installed)."""
  cfg = cfg or IndexConfig()
  cfgs = heldout.configs(eval_cfg)
  if cfg.suites:
    missing = [s for s in cfg.suites if s not in cfgs]
    if missing:
      raise ValueError(f"Contamination index: suite(s) {missing} are local and not "
                       "configured; set eval.data_dir or the suite's path override.")
    cfgs = {s: cfgs[s] for s in cfg.suites}
  out = {}
  for s, c in cfgs.items():
    if heldout.available(s):
      out[s] = c
    else:
      logging.warning("Contamination index: suite %s is not indexed (its package %s is not "
                      "installed).", s, heldout.PACKAGES[s])
  return out


def digest(eval_cfg=None, cfg: IndexConfig | None = None) -> str:
  """The index's content digest: settings, package versions and data-file SHA-256s."""
  cfg = cfg or IndexConfig()
  spec = {"version": VERSION, "python": list(sys.version_info[:2]),
          "numpy": np.__version__, "config": dataclasses.asdict(cfg),
          "sources": heldout.sources(suite_configs(eval_cfg, cfg))}
  return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:24]


def load_index(eval_cfg=None, cfg: IndexConfig | None = None, *,
               directory: str | None = None) -> Index:
  """The index of the held-out items: from memory, from the cache, or built and cached.

  Args:
    eval_cfg: the run's ``EvalConfig`` (its ``data_dir`` and ``overrides`` decide which
      items are held out); default: the suites' own defaults.
    cfg: index settings.
    directory: cache directory (default :func:`cache_dir`).

  Returns:
    The index.
  """
  cfg = cfg or IndexConfig()
  key = digest(eval_cfg, cfg)
  path = os.path.join(directory or cache_dir(), f"{key}.npz")
  if path in _MEMO:
    return _MEMO[path]
  if os.path.exists(path):
    try:
      index = Index.load(path)
    except (OSError, ValueError, KeyError) as e:
      logging.warning("Contamination index %s is unreadable (%s); rebuilding it.", path, e)
    else:
      _MEMO[path] = index
      return index
  t0 = time.perf_counter()
  items = []
  for suite, scfg in suite_configs(eval_cfg, cfg).items():
    items += heldout.items(suite, scfg)
  index = Index.build(items, cfg, key)
  index.save(path)
  logging.info("Contamination index: %d items (%s), %d keys, built in %.1fs -> %s",
               len(index), index.counts(), len(index.keys), time.perf_counter() - t0, path)
  _MEMO[path] = index
  return index


__all__ = ["Index", "IndexConfig", "Match", "cache_dir", "digest", "gram_hashes",
           "load_index", "normalise_answer", "segment_keys", "suite_configs", "text_keys",
           "word_hashes", "words"]
