"""Byte-level vocabulary for the tiny presets, backed by `seqio.ByteVocabulary`.

Ids: 0 pad, 1 EOS, 2 unknown, then the 256 byte values offset by 3.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _seqio_bytes():
  import seqio  # pylint: disable=g-import-not-at-top  (slow import, done lazily)
  return seqio.ByteVocabulary()


class ByteVocab:
  """Text <-> ids through `seqio.ByteVocabulary`."""

  pad_id = 0
  eos_id = 1

  def __init__(self):
    self._v = _seqio_bytes()

  @property
  def vocab_size(self) -> int:
    return self._v.vocab_size

  def encode(self, text: str) -> list[int]:
    return list(self._v.encode(text))

  def decode(self, ids) -> str:
    """Decodes ids, stopping at the first EOS and dropping pad/unknown ids."""
    return self._v.decode([int(i) for i in ids])
