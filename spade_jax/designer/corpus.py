"""Grounding documents for the environment designer.

A :class:`Corpus` serves documents one at a time in a seeded order. The position in that
order is a small JSON-able dict (:meth:`Corpus.state`), stored in checkpoints so a resumed
run continues the exact sequence. Sources, chosen by ``CorpusConfig.source``:

* ``"embedded"`` (default): documentation shipped with the running Python, built offline by
  the ``spade_stdlib_docs`` tfds builder into ``<workdir>/tfds`` (see ``stdlib_docs.py``);
* ``"tfds"``: any prepared tfds dataset, by ``name`` + ``data_dir`` + ``split`` + ``text_key``;
* ``"seqio"``: a registered seqio task or mixture, by ``name``;
* ``"jsonl"``: JSON-lines files (``paths``, globs allowed), text under ``text_key``;
* ``"text"``: plain-text files, one document per file.

Random-access sources (array_record tfds datasets, including the embedded one) are read
lazily; streaming sources load at most ``max_documents`` documents into memory.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from spade_jax import console
from spade_jax.registry import names

SOURCES = names("embedded", "tfds", "seqio", "jsonl", "text", kind="corpus source",
                field="corpus.source")
_STATE_VERSION = 1
_WORD = re.compile(r"\S+")


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """Where grounding documents come from and how they are cut.

  Attributes:
    source: one of ``SOURCES``.
    name: tfds dataset name (``"wikipedia/20230601.en"``) or seqio task/mixture name.
    data_dir: tfds data directory; default ``<workdir>/tfds``.
    split: dataset split.
    text_key: feature (or JSON key) holding the document text.
    id_key: feature holding a document id; default: derived from source and position.
    paths: files or glob patterns for ``"jsonl"`` / ``"text"``.
    download: let tfds download and prepare a missing dataset (needs network).
    max_documents: cap on documents loaded into memory for streaming sources.
    min_words: documents shorter than this are skipped.
    max_words: truncate documents to this many words (None: no word cap).
    max_tokens: truncate to this many tokens of the tokenizer given to ``Corpus``.
    decontaminate: skip the documents that hold a held-out item, checked once when the run
      builds its corpus (``selfplay.audit.decontaminate``; the corpus itself ignores it).
  """
  source: str = "embedded"
  name: str = ""
  data_dir: str | None = None
  split: str = "train"
  text_key: str = "text"
  id_key: str | None = None
  paths: tuple[str, ...] = ()
  download: bool = False
  max_documents: int = 100_000
  min_words: int = 30
  max_words: int | None = 600
  max_tokens: int | None = None
  decontaminate: bool = False

  def __post_init__(self):
    if isinstance(self.paths, str):
      object.__setattr__(self, "paths", (self.paths,))
    else:
      object.__setattr__(self, "paths", tuple(self.paths))
    SOURCES.check(self.source)
    if self.source in ("tfds", "seqio") and not self.name:
      raise ValueError(f"CorpusConfig(source={self.source!r}) needs `name` (the dataset or "
                       "task to read); got an empty name.")
    if self.source in ("jsonl", "text") and not self.paths:
      raise ValueError(f"CorpusConfig(source={self.source!r}) needs `paths` (files or glob "
                       "patterns); got none.")
    if self.max_documents < 1:
      raise ValueError(f"CorpusConfig.max_documents must be >= 1; got {self.max_documents}.")


@dataclasses.dataclass(frozen=True)
class Document:
  """One grounding document: a stable id and its (possibly truncated) text."""
  id: str
  text: str


class _Source(Protocol):

  def __len__(self) -> int:
    ...

  def __getitem__(self, index: int) -> Document:
    ...


class _ListSource:
  """Documents held in memory."""

  def __init__(self, docs: Sequence[Document]):
    self._docs = list(docs)

  def __len__(self) -> int:
    return len(self._docs)

  def __getitem__(self, index: int) -> Document:
    return self._docs[index]


class _TfdsRandomAccess:
  """Lazy random access into an array_record tfds split."""

  def __init__(self, data_source: Any, text_key: str, id_key: str | None, prefix: str):
    self._ds = data_source
    self._text_key = text_key
    self._id_key = id_key
    self._prefix = prefix

  def __len__(self) -> int:
    return len(self._ds)

  def __getitem__(self, index: int) -> Document:
    example = self._ds[index]
    if self._text_key not in example:
      raise KeyError(f"Feature {self._text_key!r} not in dataset {self._prefix!r}; features "
                     f"are {sorted(example)}. Set CorpusConfig.text_key to one of them.")
    doc_id = (_to_str(example[self._id_key]) if self._id_key else f"{self._prefix}:{index}")
    return Document(doc_id, _to_str(example[self._text_key]))


def _to_str(value: Any) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if hasattr(value, "item") and not isinstance(value, str):
    value = value.item()
    if isinstance(value, bytes):
      return value.decode("utf-8", errors="replace")
  return str(value)


def truncate(text: str, max_words: int | None = None, max_tokens: int | None = None,
             tokenizer: Callable[[str], Sequence[Any]] | None = None) -> str:
  """Cuts ``text`` at a word boundary to at most ``max_words`` words and ``max_tokens`` tokens.

  Original whitespace (line breaks) inside the kept prefix is preserved.

  Args:
    text: the document.
    max_words: word cap (whitespace-separated), or None.
    max_tokens: token cap, or None; needs ``tokenizer``.
    tokenizer: maps text to a sequence of tokens (e.g. a Hugging Face ``tokenizer.encode``).

  Returns:
    The longest word-boundary prefix that satisfies both caps.
  """
  ends = [m.end() for m in _WORD.finditer(text)]
  n = len(ends)
  if max_words is not None and n > max_words:
    n = max_words
  if max_tokens is not None:
    if tokenizer is None:
      raise ValueError(f"max_tokens={max_tokens} needs a tokenizer callable; pass "
                       "Corpus(..., tokenizer=tok.encode) or set max_tokens=None.")
    if n and len(tokenizer(text[:ends[n - 1]])) > max_tokens:
      lo, hi = 0, n  # Largest k in [0, n) with tokens(prefix_k) <= max_tokens.
      while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer(text[:ends[mid - 1]])) <= max_tokens:
          lo = mid
        else:
          hi = mid - 1
      n = lo
  if n == len(ends):
    return text.strip()
  return text[:ends[n - 1]].strip() if n else ""


def _feistel_key(seed: int, epoch: int) -> bytes:
  return hashlib.blake2b(f"spade-corpus:{seed}:{epoch}".encode(), digest_size=16).digest()


def permute_index(index: int, n: int, key: bytes) -> int:
  """A keyed bijection on ``[0, n)`` with O(1) memory (Feistel network + cycle walking).

  Args:
    index: position in ``[0, n)``.
    n: domain size (any size; no permutation array is materialised).
    key: the permutation's key, e.g. derived from seed and epoch.

  Returns:
    The document index at that position.
  """
  if not 0 <= index < n:
    raise IndexError(f"index {index} outside [0, {n}).")
  bits = max(2, (n - 1).bit_length())
  bits += bits % 2
  half = bits // 2
  mask = (1 << half) - 1
  x = index
  while True:
    left, right = x >> half, x & mask
    for rnd in range(4):
      digest = hashlib.blake2b(right.to_bytes(8, "little") + bytes([rnd]), key=key,
                               digest_size=8).digest()
      left, right = right, left ^ (int.from_bytes(digest, "little") & mask)
    x = (left << half) | right
    if x < n:
      return x


class Corpus:
  """A seeded, resumable stream of grounding documents.

  Example:
    corpus = Corpus(CorpusConfig(), workdir="/tmp/run", seed=0)
    doc = corpus.next()            # Document(id="stdlib/heapq", text="...")
    state = corpus.state()         # JSON-able; store it in the checkpoint
    corpus.restore(state)          # continue exactly from there
  """

  def __init__(self, config: CorpusConfig | None = None, *, workdir: str | None = None,
               seed: int = 0, tokenizer: Callable[[str], Sequence[Any]] | None = None):
    """Opens (and for ``"embedded"`` builds, offline) the configured source.

    Args:
      config: the corpus config; default ``CorpusConfig()`` (embedded documents).
      workdir: run directory; tfds data goes under ``<workdir>/tfds`` unless
        ``config.data_dir`` is set.
      seed: order seed; the same seed gives the same document sequence.
      tokenizer: text -> tokens callable, needed when ``config.max_tokens`` is set.
    """
    self.config = config or CorpusConfig()
    if self.config.max_tokens is not None and tokenizer is None:
      raise ValueError(f"CorpusConfig.max_tokens={self.config.max_tokens} needs "
                       "Corpus(..., tokenizer=callable); got tokenizer=None.")
    self._tokenizer = tokenizer
    self._seed = int(seed)
    self._epoch = 0
    self._position = 0
    self._data_dir = self.config.data_dir or (
        os.path.join(workdir, "tfds") if workdir else None)
    self._source = self._open()
    if len(self._source) == 0:
      raise ValueError(f"Corpus source {self._describe()} holds no documents with at least "
                       f"{self.config.min_words} words; check paths/split/text_key or lower "
                       "min_words.")
    self._filter_lazily = isinstance(self._source, _TfdsRandomAccess)

  # -- sources ------------------------------------------------------------------------

  def _describe(self) -> str:
    c = self.config
    where = c.name or ",".join(c.paths) or "stdlib"
    return f"{c.source}:{where}:{c.split}"

  def _open(self) -> _Source:
    c = self.config
    if c.source == "embedded":
      from spade_jax.designer import stdlib_docs  # pylint: disable=g-import-not-at-top
      with console.hushed():  # tfds announces a download and draws progress bars
        builder = stdlib_docs.build(self._data_dir or os.path.expanduser(
            "~/tensorflow_datasets"))
      return _TfdsRandomAccess(builder.as_data_source(split=c.split), "text", "id",
                               "spade_stdlib_docs")
    if c.source == "tfds":
      return self._open_tfds()
    if c.source == "seqio":
      return self._open_seqio()
    if c.source == "jsonl":
      return _ListSource(self._read_jsonl())
    return _ListSource(self._read_text())

  def _keep(self, text: str) -> bool:
    return len(_WORD.findall(text)) >= self.config.min_words

  def _open_tfds(self) -> _Source:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from spade_jax.designer import stdlib_docs  # pylint: disable=g-import-not-at-top
    c = self.config
    with stdlib_docs.tfds_tempdirs_removed():
      builder = tfds.builder(c.name, data_dir=self._data_dir, try_gcs=False)
      if not builder.is_prepared():
        if not c.download:
          raise FileNotFoundError(
              f"tfds dataset {c.name!r} is not prepared under data_dir={self._data_dir!r}. "
              f"Prepare it with `tfds build {c.name} --data_dir=<dir>` or set "
              "CorpusConfig.download=True (needs network).")
        with console.hushed():
          builder.download_and_prepare()
    try:
      return _TfdsRandomAccess(builder.as_data_source(split=c.split), c.text_key, c.id_key,
                               c.name)
    except (NotImplementedError, ValueError, KeyError, FileNotFoundError):
      ds = builder.as_dataset(split=c.split, shuffle_files=False).take(c.max_documents)
      return _ListSource(self._from_examples(tfds.as_numpy(ds), c.name))

  def _open_seqio(self) -> _Source:
    import seqio  # pylint: disable=g-import-not-at-top
    c = self.config
    try:
      task = seqio.get_mixture_or_task(c.name)
    except ValueError as e:
      raise ValueError(f"seqio task or mixture {c.name!r} is not registered; import the "
                       "module that registers it before building the Corpus.") from e
    ds = task.get_dataset(sequence_length=None, split=c.split, shuffle=False,
                          num_epochs=1).take(c.max_documents)
    return _ListSource(self._from_examples(ds.as_numpy_iterator(), c.name))

  def _from_examples(self, examples, prefix: str) -> list[Document]:
    c = self.config
    docs = []
    for i, ex in enumerate(examples):
      if c.text_key not in ex:
        raise KeyError(f"Feature {c.text_key!r} not in {prefix!r}; features are "
                       f"{sorted(ex)}. Set CorpusConfig.text_key to one of them.")
      text = _to_str(ex[c.text_key])
      if self._keep(text):
        doc_id = _to_str(ex[c.id_key]) if c.id_key else f"{prefix}:{i}"
        docs.append(Document(doc_id, text))
    return docs

  def _files(self) -> list[str]:
    files = []
    for pattern in self.config.paths:
      matched = sorted(glob.glob(os.path.expanduser(pattern)))
      if not matched:
        raise FileNotFoundError(f"Corpus path {pattern!r} matches no file; check "
                                "CorpusConfig.paths.")
      files.extend(matched)
    return files

  def _read_jsonl(self) -> list[Document]:
    c = self.config
    docs = []
    for path in self._files():
      name = os.path.basename(path)
      with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
          if not line.strip():
            continue
          try:
            obj = json.loads(line)
          except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno} is not valid JSON ({e.msg}); each line of a "
                             "JSONL corpus must be one JSON object.") from e
          if not isinstance(obj, dict) or c.text_key not in obj:
            raise KeyError(f"{path}:{lineno} has no key {c.text_key!r}; set "
                           "CorpusConfig.text_key to the key that holds the text.")
          text = str(obj[c.text_key])
          if self._keep(text):
            doc_id = str(obj[c.id_key]) if c.id_key and c.id_key in obj else f"{name}:{lineno}"
            docs.append(Document(doc_id, text))
          if len(docs) >= c.max_documents:
            return docs
    return docs

  def _read_text(self) -> list[Document]:
    docs = []
    for path in self._files()[:self.config.max_documents]:
      with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
      if self._keep(text):
        docs.append(Document(os.path.basename(path), text))
    return docs

  # -- sequence ------------------------------------------------------------------------

  def __len__(self) -> int:
    return len(self._source)

  def _advance(self) -> int:
    n = len(self._source)
    index = permute_index(self._position, n, _feistel_key(self._seed, self._epoch))
    self._position += 1
    if self._position == n:
      self._epoch, self._position = self._epoch + 1, 0
    return index

  def _finish(self, doc: Document) -> Document:
    c = self.config
    return Document(doc.id, truncate(doc.text, c.max_words, c.max_tokens, self._tokenizer))

  def next(self) -> Document:
    """Returns the next document in the seeded order (cycling through epochs)."""
    for _ in range(len(self._source)):
      doc = self._source[self._advance()]
      if not self._filter_lazily or self._keep(doc.text):
        return self._finish(doc)
    raise ValueError(f"No document in {self._describe()} has at least "
                     f"{self.config.min_words} words; lower CorpusConfig.min_words.")

  def get(self, index: int) -> Document:
    """The (truncated) document at source index ``index``, outside the sequence."""
    return self._finish(self._source[index])

  def _fingerprint(self) -> str:
    return f"{self._describe()}:{len(self._source)}"

  def state(self) -> dict[str, Any]:
    """JSON-able position in the sequence: ``{"version", "seed", "epoch", "position", ...}``."""
    return {"version": _STATE_VERSION, "seed": self._seed, "epoch": self._epoch,
            "position": self._position, "source": self._fingerprint()}

  def restore(self, state: dict[str, Any]) -> None:
    """Continues the sequence from a dict produced by :meth:`state`.

    Args:
      state: the saved position.

    Raises:
      ValueError: if the state was saved for a different source or size.
    """
    expected = self._fingerprint()
    if state.get("source") != expected:
      raise ValueError(f"Corpus state was saved for source {state.get('source')!r} but this "
                       f"corpus is {expected!r}; restore with the same CorpusConfig (and "
                       "Python version for the embedded corpus) or start a fresh sequence.")
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"Corpus state version {state.get('version')!r}; expected "
                       f"{_STATE_VERSION}.")
    self._seed = int(state["seed"])
    self._epoch = int(state["epoch"])
    self._position = int(state["position"])
