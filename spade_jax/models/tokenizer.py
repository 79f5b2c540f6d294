"""Hugging Face `tokenizer.json` vocabularies, loaded offline with `tokenizers`.

`HFTokenizer` has the same small interface as `ByteVocab` (encode, decode,
eos_id, pad_id, vocab_size), so `ChatTemplate` and the self-play runner work
with either.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

# Turn-end and padding tokens of the Qwen3 vocabulary, preferred when present.
_EOS_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "</s>")
_PAD_CANDIDATES = ("<|endoftext|>", "<pad>", "<|pad|>")

# Qwen2/Qwen3's pre-tokenizer split (their tokenizer.json): contractions, letter runs with
# one leading non-letter, every digit on its own, punctuation runs, newlines, spaces.
QWEN3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = ("qwen3", "bytelevel")


def _special(cfg: dict, key: str) -> str | None:
  value = cfg.get(key)
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


class HFTokenizer:
  """Text <-> ids through a `tokenizer.json` file.

  Attributes:
    eos_id: id that ends a model turn: `<|im_end|>` when the vocabulary has it
      (Qwen3 chat), else the `eos_token` of tokenizer_config.json.
    pad_id: padding id (`<|endoftext|>` for Qwen3).
  """

  def __init__(self, path: str):
    import tokenizers  # pylint: disable=g-import-not-at-top  (optional dependency)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{file!r} does not exist: expected a Hugging Face "
                              "tokenizer.json (fast tokenizer) file.")
    self._tok = tokenizers.Tokenizer.from_file(file)
    tc = {}
    if os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
      with open(os.path.join(directory, "tokenizer_config.json")) as f:
        tc = json.load(f)
    self.eos_id = self._first_id(_EOS_CANDIDATES, _special(tc, "eos_token"))
    self.pad_id = self._first_id(_PAD_CANDIDATES, _special(tc, "pad_token"))
    if self.eos_id is None:
      raise ValueError(f"{file!r}: found no end-of-turn token (tried {_EOS_CANDIDATES} "
                       "and tokenizer_config.json eos_token); add one to the vocabulary.")
    if self.pad_id is None:
      self.pad_id = self.eos_id

  def _first_id(self, candidates, configured: str | None) -> int | None:
    for name in candidates + ((configured,) if configured else ()):
      i = self._tok.token_to_id(name)
      if i is not None:
        return i
    return None

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def encode(self, text: str) -> list[int]:
    """Ids of `text`; special-token markup such as `<|im_start|>` maps to its id."""
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes ids, stopping at the first EOS (special tokens kept as text)."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(directory: str) -> HFTokenizer | None:
  """The directory's `tokenizer.json` tokenizer, or None when it has none."""
  if os.path.isfile(os.path.join(directory, "tokenizer.json")):
    return HFTokenizer(directory)
  return None


# Qwen3's added tokens: chat markup, thinking and tool-call tags.
QWEN3_ADDED_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                      "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def train_bpe(texts: Sequence[str], vocab_size: int, directory: str,
              added_tokens: Sequence[str] = QWEN3_ADDED_TOKENS,
              pre_tokenizer: str = "qwen3") -> HFTokenizer:
  """Trains a byte-level BPE vocabulary offline and writes it as Hugging Face files.

  The result has the shape of a Qwen3 tokenizer: byte-level pre-tokenisation (every
  string encodes), Qwen3's chat and tool tags as single added tokens, ``<|im_end|>`` as
  the end of a turn and ``<|endoftext|>`` as padding.

  Args:
    texts: training text; the same texts give the same vocabulary.
    vocab_size: total ids, added tokens and the 256 byte symbols included.
    directory: where ``tokenizer.json`` and ``tokenizer_config.json`` are written.
    added_tokens: tokens kept whole (the first is padding, the third the turn end).
    pre_tokenizer: "qwen3" (Qwen3's split before the byte mapping: every digit is its own
      token, so numbers are spelled digit by digit as in Qwen3) or "bytelevel" (GPT-2's
      byte-level split, which merges digit runs into multi-digit tokens).

  Returns:
    The tokenizer, loaded from the written files.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top  (optional dependency)
  if vocab_size < 256 + len(added_tokens) + 1:
    raise ValueError(f"vocab_size={vocab_size} leaves no room for merges: it must exceed "
                     f"the 256 byte symbols plus {len(added_tokens)} added tokens.")
  if pre_tokenizer not in PRE_TOKENIZERS:
    raise ValueError(f"pre_tokenizer={pre_tokenizer!r}: expected one of {PRE_TOKENIZERS}.")
  pre = tokenizers.pre_tokenizers
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  if pre_tokenizer == "qwen3":
    tok.pre_tokenizer = pre.Sequence([
        pre.Split(tokenizers.Regex(QWEN3_SPLIT), behavior="isolated", invert=False),
        pre.ByteLevel(add_prefix_space=False, use_regex=False)])
  else:
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(added_tokens), show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(list(texts), trainer)
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "model_max_length": 32768, "tokenizer_class": "Qwen2TokenizerFast"}, f, indent=1)
  return HFTokenizer(directory)
