"""Packs designer samples and agent episodes into one fixed-shape GRPO batch."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.rl.train_step import ROLES


@dataclasses.dataclass
class Row:
  """One training sequence: ids, which of them are trained on, sampler log-probs."""

  tokens: list[int]
  loss_mask: list[bool]
  logps: list[float]
  advantage: float
  role: str

  def __post_init__(self):
    if not len(self.tokens) == len(self.loss_mask) == len(self.logps):
      raise ValueError(f"Row fields differ in length: tokens {len(self.tokens)}, "
                       f"loss_mask {len(self.loss_mask)}, logps {len(self.logps)}.")
    if self.role not in ROLES:
      raise ValueError(f"Row role {self.role!r}; expected one of {ROLES}.")


def build_batch(rows: Sequence[Row], batch_size: int, seq_len: int,
                pad_id: int = 0) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """Lays rows out as [batch_size, seq_len] arrays (one sequence per row).

  Rows beyond `batch_size` are dropped and tokens beyond `seq_len` cut; both
  are counted in the returned stats. Unused rows have an empty loss mask.
  """
  B, T = batch_size, seq_len
  out = {
      "tokens": np.full((B, T), pad_id, np.int32),
      "positions": np.zeros((B, T), np.int32),
      "segment_ids": np.zeros((B, T), np.int32),
      "loss_mask": np.zeros((B, T), bool),
      "old_logps": np.zeros((B, T), np.float32),
      "advantages": np.zeros((B,), np.float32),
      "role": np.zeros((B,), np.int32),
  }
  cut = 0
  for i, row in enumerate(rows[:B]):
    n = min(len(row.tokens), T)
    cut += len(row.tokens) - n
    out["tokens"][i, :n] = row.tokens[:n]
    out["positions"][i, :n] = np.arange(n)
    out["segment_ids"][i, :n] = 1
    out["loss_mask"][i, :n] = row.loss_mask[:n]
    out["old_logps"][i, :n] = row.logps[:n]
    out["advantages"][i] = row.advantage
    out["role"][i] = ROLES.index(row.role)
  stats = {"batch/rows": float(min(len(rows), B)),
           "batch/dropped_rows": float(max(0, len(rows) - B)),
           "batch/cut_tokens": float(cut)}
  for r in ROLES:
    stats[f"batch/{r}_rows"] = float(sum(1 for x in rows[:B] if x.role == r))
  return out, stats
