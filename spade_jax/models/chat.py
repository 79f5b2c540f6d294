"""Chat rendering into token ids (Qwen3 chat markup), shared by every role.

Conversations are built by concatenating token ids, never by re-encoding
earlier text, so a multi-turn transcript is exactly the sequence the sampler
conditioned on and its log-probs stay valid for training.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Vocab(Protocol):
  eos_id: int

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


class ChatTemplate:
  """Qwen3-style `<|im_start|>role ... <|im_end|>` markup over any vocabulary.

  The model ends its own turn with `vocab.eos_id`; `turn_end` follows it in the
  history.
  """

  def __init__(self, vocab: Vocab):
    self.vocab = vocab

  def message(self, role: str, text: str) -> list[int]:
    if role not in ("system", "user", "tool"):
      raise ValueError(f"Unknown chat role {role!r}; expected system, user or tool "
                       "(assistant turns are generated).")
    return self.vocab.encode(f"<|im_start|>{role}\n{text}<|im_end|>\n")

  def assistant_prefix(self) -> list[int]:
    return self.vocab.encode("<|im_start|>assistant\n")

  def turn_end(self) -> list[int]:
    return self.vocab.encode("\n")

  def prompt(self, system: str | None, user: str) -> list[int]:
    """System + user messages followed by the assistant prefix."""
    ids = self.message("system", system) if system else []
    return ids + self.message("user", user) + self.assistant_prefix()

  def continuation(self, observation: str, role: str = "user") -> list[int]:
    """Tokens appended after an assistant turn: its end, a new message, the prefix."""
    return self.turn_end() + self.message(role, observation) + self.assistant_prefix()
