"""Packs designer samples and agent episodes into one fixed-shape GRPO batch.

Sequences are packed several per row (first-fit, longest first): each gets a
segment id (1, 2, ... within its row), positions that restart at 0, and its
advantage and role on every one of its tokens. The model attends only within
a segment, and the loss keys its per-sequence terms by segment, so packing
changes throughput, not the update.
"""

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


def first_fit(lengths: Sequence[int], num_bins: int, capacity: int) -> list[int]:
  """First-fit-decreasing assignment of items to bins.

  Args:
    lengths: item sizes (each at most `capacity`).
    num_bins: number of bins (rows).
    capacity: size of every bin (tokens per row).

  Returns:
    The bin of each item, or -1 for items that fit in no bin. Ties keep the
    input order, so the assignment is deterministic.
  """
  free = [capacity] * num_bins
  where = [-1] * len(lengths)
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    for b in range(num_bins):
      if free[b] >= lengths[i]:
        free[b] -= lengths[i]
        where[i] = b
        break
  return where


def build_batch(rows: Sequence[Row], batch_size: int, seq_len: int,
                pad_id: int = 0, pack: bool = True
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """Lays sequences out as [batch_size, seq_len] arrays.

  Args:
    rows: the sequences to train on.
    batch_size: rows B of the batch.
    seq_len: tokens T per row.
    pad_id: token id of padding.
    pack: pack several sequences per row (first-fit decreasing); False puts
      one sequence per row in input order.

  Returns:
    (arrays, stats). arrays: "tokens", "positions", "segment_ids" (0 =
    padding), "loss_mask", "old_logps", "advantages" (per token) and "role"
    (per token, index into `ROLES`), all [B, T]. stats: "batch/rows"
    (sequences placed), "batch/dropped_rows" (sequences that did not fit),
    "batch/cut_tokens" (tokens beyond seq_len cut from long sequences),
    "batch/rows_used", "batch/packing_efficiency" (placed tokens / (B * T)),
    "batch/loss_tokens" and per-role sequence counts.

  Sequences longer than `seq_len` are cut; the first token of every
  sequence is never trained on (nothing predicts it).
  """
  B, T = batch_size, seq_len
  out = {
      "tokens": np.full((B, T), pad_id, np.int32),
      "positions": np.zeros((B, T), np.int32),
      "segment_ids": np.zeros((B, T), np.int32),
      "loss_mask": np.zeros((B, T), bool),
      "old_logps": np.zeros((B, T), np.float32),
      "advantages": np.zeros((B, T), np.float32),
      "role": np.zeros((B, T), np.int32),
  }
  lengths = [min(len(r.tokens), T) for r in rows]
  cut = sum(len(r.tokens) - n for r, n in zip(rows, lengths))
  if pack:
    where = first_fit(lengths, B, T)
  else:
    where = [i if i < B else -1 for i in range(len(rows))]
  fill = [0] * B
  segs = [0] * B
  placed = []
  for i, (row, n, b) in enumerate(zip(rows, lengths, where)):
    if b < 0:
      continue
    placed.append(i)
    s, e = fill[b], fill[b] + n
    segs[b] += 1
    out["tokens"][b, s:e] = row.tokens[:n]
    out["positions"][b, s:e] = np.arange(n)
    out["segment_ids"][b, s:e] = segs[b]
    out["loss_mask"][b, s:e] = row.loss_mask[:n]
    out["loss_mask"][b, s] = False
    out["old_logps"][b, s:e] = row.logps[:n]
    out["advantages"][b, s:e] = row.advantage
    out["role"][b, s:e] = ROLES.index(row.role)
    fill[b] = e
  stats = {"batch/rows": float(len(placed)),
           "batch/dropped_rows": float(len(rows) - len(placed)),
           "batch/cut_tokens": float(cut),
           "batch/rows_used": float(sum(1 for f in fill if f)),
           "batch/packing_efficiency": float(sum(fill)) / float(B * T),
           "batch/loss_tokens": float(out["loss_mask"].sum())}
  for r in ROLES:
    stats[f"batch/{r}_rows"] = float(sum(1 for i in placed if rows[i].role == r))
  return out, stats
