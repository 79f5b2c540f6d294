"""Packs designer samples and agent episodes into fixed-shape GRPO batches.

Every sequence is trained on: sequences are packed several per row, first-fit
in input order (the caller puts designer rows first, then agent rows, as the
reference's batch does), and what does not fit in one [B, T] batch goes into
further batches of the same shape, which `rl.Trainer.step` turns into ONE
optimizer update (so nothing recompiles and no GRPO group loses members). A
sequence longer than T is cut to its first T tokens, never dropped.

Each sequence gets a segment id (1, 2, ... within its row), positions that
restart at 0, and its advantage and role on every one of its tokens. The model
attends only within a segment, and the loss keys its per-sequence terms by
segment, so packing changes throughput, not the update.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.rl.train_step import ROLES


@dataclasses.dataclass
class Row:
  """One training sequence.

  Attributes:
    tokens: token ids of the whole sequence (prompt and completion).
    loss_mask: per token, True where the token is trained on.
    logps: per token, the sampler's log-prob of the token, recorded when it
      was sampled (becomes the batch field `sampler_logps`; any value where
      `loss_mask` is False).
    advantage: the sequence's advantage (designer reward or agent advantage).
    role: one of `ROLES`.
    temperature: the softmax temperature the sequence was sampled at (1 for
      greedy rows); the trainer differentiates `log_softmax(logits / T)`, the
      policy whose log-probs `logps` recorded.
  """

  tokens: list[int]
  loss_mask: list[bool]
  logps: list[float]
  advantage: float
  role: str
  temperature: float = 1.0

  def __post_init__(self):
    if not len(self.tokens) == len(self.loss_mask) == len(self.logps):
      raise ValueError(f"Row fields differ in length: tokens {len(self.tokens)}, "
                       f"loss_mask {len(self.loss_mask)}, logps {len(self.logps)}.")
    if self.role not in ROLES:
      raise ValueError(f"Row role {self.role!r}; expected one of {ROLES}.")
    if not self.temperature > 0:
      raise ValueError(f"Row temperature {self.temperature!r} must be > 0 (use 1.0 for a "
                       "greedy row, whose log-probs are of the untempered model).")


def _empty(B: int, T: int, pad_id: int) -> dict[str, np.ndarray]:
  return {
      "tokens": np.full((B, T), pad_id, np.int32),
      "positions": np.zeros((B, T), np.int32),
      "segment_ids": np.zeros((B, T), np.int32),
      "loss_mask": np.zeros((B, T), bool),
      "sampler_logps": np.zeros((B, T), np.float32),
      "advantages": np.zeros((B, T), np.float32),
      "role": np.zeros((B, T), np.int32),
      "temperature": np.ones((B, T), np.float32),
  }


def build_batches(rows: Sequence[Row], batch_size: int, seq_len: int,
                  pad_id: int = 0, pack: bool = True
                  ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
  """Lays every sequence out in as many [batch_size, seq_len] batches as needed.

  Args:
    rows: the sequences to train on, in the order to place them (designer
      rows first, then agent rows).
    batch_size: rows B of every batch.
    seq_len: tokens T per row.
    pad_id: token id of padding.
    pack: pack several sequences per row, first-fit in input order (each
      sequence goes into the first row, over all batches so far, with room
      for it; else it opens a new row, and a new batch after B rows). Long
      and short sequences are treated alike, so which batch a sequence lands
      in depends only on the order and lengths. False puts one sequence per
      row in input order.

  Returns:
    (batches, stats). batches: a non-empty list (one all-padding batch when
    `rows` is empty) of dicts with "tokens", "positions", "segment_ids" (0 =
    padding), "loss_mask", "sampler_logps" (the rows' `logps`), "advantages"
    (per token), "role" (per token, index into `ROLES`) and "temperature"
    (per token, the row's sampling temperature; 1 on padding), all [B, T]; pass
    the whole list to `rl.Trainer.step` for one update. stats:
    "batch/batches", "batch/rows" (sequences placed: all of them),
    "batch/cut_tokens" (tokens beyond seq_len cut from long sequences),
    "batch/rows_used" (rows holding a sequence, over all batches),
    "batch/packing_efficiency" (placed tokens / (batches * B * T)),
    "batch/loss_tokens" and "batch/<role>_rows" per role.

  The first token of every sequence is never trained on (nothing predicts
  it).
  """
  B, T = batch_size, seq_len
  lengths = [min(len(r.tokens), T) for r in rows]
  cut = sum(len(r.tokens) - n for r, n in zip(rows, lengths))
  # Global row index of every sequence (batch = index // B).
  fill: list[int] = []   # tokens used per opened row
  where: list[int] = []
  for n in lengths:
    if pack:
      b = next((j for j, f in enumerate(fill) if f + n <= T), len(fill))
    else:
      b = len(fill)
    if b == len(fill):
      fill.append(0)
    where.append(b)
    fill[b] += n
  num_batches = max(1, -(-len(fill) // B))
  batches = [_empty(B, T, pad_id) for _ in range(num_batches)]
  start = [0] * len(fill)
  segs = [0] * len(fill)
  for row, n, g in zip(rows, lengths, where):
    segs[g] += 1
    if not n:
      continue
    out, b = batches[g // B], g % B
    s, e = start[g], start[g] + n
    out["tokens"][b, s:e] = row.tokens[:n]
    out["positions"][b, s:e] = np.arange(n)
    out["segment_ids"][b, s:e] = segs[g]
    out["loss_mask"][b, s:e] = row.loss_mask[:n]
    out["loss_mask"][b, s] = False
    out["sampler_logps"][b, s:e] = row.logps[:n]
    out["advantages"][b, s:e] = row.advantage
    out["role"][b, s:e] = ROLES.index(row.role)
    out["temperature"][b, s:e] = row.temperature
    start[g] = e
  stats = {"batch/batches": float(num_batches),
           "batch/rows": float(len(rows)),
           "batch/cut_tokens": float(cut),
           "batch/rows_used": float(sum(1 for f in fill if f)),
           "batch/packing_efficiency": float(sum(fill)) / float(num_batches * B * T),
           "batch/loss_tokens": float(sum(o["loss_mask"].sum() for o in batches))}
  for r in ROLES:
    stats[f"batch/{r}_rows"] = float(sum(1 for row in rows if row.role == r))
  return batches, stats
