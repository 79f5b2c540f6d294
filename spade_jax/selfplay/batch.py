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

Shared prompts (`share_prefix`): consecutive sequences that begin with the same
untrained tokens (the plays of one env, designer samples of one prompt) become
one unit: the common prompt once, as a segment with a negative id and no loss,
then each sequence's remainder as its own segment whose `prefix_ids` name the
prompt's segment, with positions that continue the prompt's. The mask lets each
remainder see the prompt and itself only (`models.segment_mask`), so every
token is predicted from exactly its own history and the update is the same,
on fewer token positions. A remainder starts with the prompt's last token (not
trained on: nothing in its segment predicts it), so the first trained token is
predicted within its own segment.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.rl.objectives import ROLES


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


def loss_tokens(row: Row, seq_len: int) -> int:
  """Tokens of `row` that `build_batches` trains on in rows of `seq_len`: its loss mask
  within the first `seq_len` tokens, less the first token (nothing predicts it)."""
  return int(np.count_nonzero(np.asarray(row.loss_mask[1:seq_len], bool)))


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
      "prefix_ids": np.zeros((B, T), np.int32),
  }


def _untrained(row: Row, n: int) -> int:
  """Leading tokens of the row's first `n` that are not trained on (its first token never is)."""
  m = np.asarray(row.loss_mask[:n], bool).copy()
  m[:1] = False
  hit = np.flatnonzero(m)
  return int(hit[0]) if hit.size else n


def _common(a: np.ndarray, b: np.ndarray) -> int:
  """Length of the common prefix of two id arrays."""
  n = min(len(a), len(b))
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


def _units(rows: Sequence[Row], lengths: list[int], T: int,
           share: int) -> list[tuple[int, list[int]]]:
  """Consecutive sequences grouped into packing units: (shared prompt length S, members).

  A unit of one member is a whole sequence (S = 0). Members of a larger unit
  share their first S >= `share` tokens, untrained in each (and so is the token
  after them, which starts each member's remainder), and the unit fits in T.
  Once two members have set S, a sequence that shares fewer tokens with them
  opens a new unit rather than cutting S for all (the next group's plays, whose
  questions begin alike, share their whole prompt among themselves instead).
  """
  if not share:
    return [(0, [i]) for i in range(len(rows))]
  units: list[tuple[int, list[int]]] = []
  prompt = None  # the open unit's shareable ids
  for i, (row, n) in enumerate(zip(rows, lengths)):
    own = np.asarray(row.tokens[:max(0, _untrained(row, n) - 1)], np.int64)
    if units:
      S = _common(prompt, own)
      members = units[-1][1] + [i]
      settled = len(members) > 2 and S < len(prompt)
      if S >= share and not settled and S + sum(lengths[j] - S for j in members) <= T:
        units[-1], prompt = (S, members), prompt[:S]
        continue
    units.append((0, [i]))
    prompt = own
  return [(S if len(m) > 1 else 0, m) for S, m in units]


def build_batches(rows: Sequence[Row], batch_size: int, seq_len: int,
                  pad_id: int = 0, pack: bool = True, share_prefix: int = 0,
                  width_bucket: int = 0, widths: Sequence[int] = (),
                  waste: dict[int, int] | None = None, patience: float = 0.0
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
    share_prefix: 0 (lay out every sequence whole), or the shortest shared
      prompt (tokens) that consecutive sequences pack once (see the module
      docstring; `rl.TrainConfig.share_prefix`). A shared unit is placed like
      one sequence.
    width_bucket: 0 (every batch seq_len wide), or cut every batch to the
      longest filled row rounded up to a multiple of it (at most seq_len;
      `rl.TrainConfig.width_bucket`): the trailing columns cut hold padding only.
    widths: with `width_bucket`, widths already in use (e.g. compiled,
      `rl.Trainer.widths`): the narrowest of them that holds every row is taken
      instead of a new one, so a run compiles a new width only when a batch
      needs more room than any before, or (with `waste`) when a narrower one
      has earned it.
    waste: with `widths`, a running tally (updated in place; e.g.
      `rl.Trainer.width_waste`) of the padding columns (times rows) spent on a
      used width by batches that a narrower new width would have held, per
      such width. Once a candidate's tally reaches `patience` x seq_len x
      batch_size, the narrowest such candidate is taken (and compiles). None:
      used widths are always reused.
    patience: see `waste` (`rl.TrainConfig.width_patience`).

  Returns:
    (batches, stats). batches: a non-empty list (one all-padding batch when
    `rows` is empty) of dicts with "tokens", "positions", "segment_ids" (0 =
    padding), "loss_mask", "sampler_logps" (the rows' `logps`), "advantages"
    (per token), "role" (per token, index into `ROLES`) and "temperature"
    (per token, the row's sampling temperature; 1 on padding) and "prefix_ids"
    (per token, the shared prompt segment it also sees; 0: none), all [B, T]; pass
    the whole list to `rl.Trainer.step` for one update. stats:
    "batch/batches", "batch/rows" (sequences placed: all of them),
    "batch/cut_tokens" (tokens beyond seq_len cut from long sequences),
    "batch/rows_used" (rows holding a sequence, over all batches),
    "batch/packing_efficiency" (placed tokens / (batches * B * T)),
    "batch/loss_tokens", "batch/width" (tokens per row as laid out),
    "batch/width_padding" (columns past the narrowest bucket that holds the rows),
    "batch/shared_tokens" (prompt tokens laid out once
    instead of once per sequence) and "batch/<role>_rows" per role.

  The first token of every sequence is never trained on (nothing predicts
  it).
  """
  B, T = batch_size, seq_len
  if share_prefix < 0:
    raise ValueError(f"share_prefix={share_prefix}; expected 0 or a positive token count.")
  if width_bucket < 0:
    raise ValueError(f"width_bucket={width_bucket}; expected 0 or a positive token count.")
  lengths = [min(len(r.tokens), T) for r in rows]
  cut = sum(len(r.tokens) - n for r, n in zip(rows, lengths))
  units = _units(rows, lengths, T, share_prefix if pack else 0)
  sizes = [S + sum(lengths[j] - S for j in m) for S, m in units]
  # Global row index of every unit (batch = index // B).
  fill: list[int] = []   # tokens used per opened row
  where: list[int] = []
  for n in sizes:
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
  for (S, members), g in zip(units, where):
    out, b = batches[g // B], g % B
    prefix = 0
    if S:  # the shared prompt once: its own (negative) segment, no loss
      segs[g] += 1
      prefix = -segs[g]
      s = start[g]
      head = rows[members[0]]
      out["tokens"][b, s:s + S] = head.tokens[:S]
      out["positions"][b, s:s + S] = np.arange(S)
      out["segment_ids"][b, s:s + S] = prefix
      out["role"][b, s:s + S] = ROLES.index(head.role)
      start[g] = s + S
    for i in members:
      row, n = rows[i], lengths[i]
      segs[g] += 1
      if not n:
        continue
      s, e = start[g], start[g] + n - S
      out["tokens"][b, s:e] = row.tokens[S:n]
      out["positions"][b, s:e] = np.arange(S, n)
      out["segment_ids"][b, s:e] = segs[g]
      out["prefix_ids"][b, s:e] = prefix
      out["loss_mask"][b, s:e] = row.loss_mask[S:n]
      out["loss_mask"][b, s] = False
      out["sampler_logps"][b, s:e] = row.logps[S:n]
      out["advantages"][b, s:e] = row.advantage
      out["role"][b, s:e] = ROLES.index(row.role)
      out["temperature"][b, s:e] = row.temperature
      start[g] = e
  over = 0
  if width_bucket:
    need = min(T, max(1, -(-max(fill, default=0) // width_bucket)) * width_bucket)
    W = min([w for w in widths if need <= w <= T], default=need)
    if W > need and waste is not None:
      # Rent or buy: each narrower candidate is charged the columns this batch pays
      # beyond it; the narrowest whose charges have reached the patience is compiled.
      earned = None
      for w in range(need, W, width_bucket):
        waste[w] = waste.get(w, 0) + (W - w) * B * num_batches
        if earned is None and waste[w] >= patience * T * B:
          earned = w
      if earned is not None:
        W = earned
        for w in [w for w in waste if w >= earned]:
          del waste[w]
    over = W - need
    batches = [{k: v[:, :W] for k, v in b.items()} for b in batches]
    T = W
  stats = {"batch/batches": float(num_batches),
           "batch/rows": float(len(rows)),
           "batch/cut_tokens": float(cut),
           "batch/rows_used": float(sum(1 for f in fill if f)),
           "batch/packing_efficiency": float(sum(fill)) / float(num_batches * B * T),
           "batch/loss_tokens": float(sum(o["loss_mask"].sum() for o in batches)),
           "batch/shared_tokens": float(sum(S * (len(m) - 1) for S, m in units)),
           "batch/width": float(T), "batch/width_padding": float(over)}
  for r in ROLES:
    stats[f"batch/{r}_rows"] = float(sum(1 for row in rows if row.role == r))
  return batches, stats
