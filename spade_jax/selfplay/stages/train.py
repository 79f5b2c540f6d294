"""The train stage: the credited rows packed into GRPO batches and one update."""

from __future__ import annotations

import time

import jax

from spade_jax.metrics import compile_seconds
from spade_jax.rl import ROLES, TrainState, sequence_denominator
from spade_jax.selfplay.batch import Row, build_batches, loss_tokens


def train(trainer, state: TrainState, rows: list[Row],
          pad_id: int) -> tuple[TrainState, dict[str, float]]:
  """Packs `rows` (`batch.build_batches`) and runs one update of `trainer`.

  Where it is exact (`rl.Trainer.skips_zero_advantage`, `train.skip_zero_advantage`),
  rows with a zero advantage are not packed: their loss and gradient are exactly zero,
  and their share of the loss denominator is passed to the update instead; with no row
  left, the update applies a zero gradient (`rl.Trainer.step_without_rows`).

  Returns:
    (the new train state, the packing's and the update's metrics (with
    `batch/skipped_rows` and `batch/skipped_loss_tokens`; `batch/<role>_rows` counts
    the skipped rows too), `time/train` and
    `time/train_compile`, the part of it spent compiling).
  """
  t0, c0 = time.perf_counter(), compile_seconds()
  tc = trainer.train_cfg
  skipped: list[Row] = []
  if rows and trainer.skips_zero_advantage:
    skipped = [r for r in rows if r.advantage == 0]
    rows = [r for r in rows if r.advantage != 0]
  counts = [loss_tokens(r, tc.seq_len) for r in skipped]
  if rows or not skipped:
    batches, metrics = build_batches(rows, tc.batch_size, tc.seq_len, pad_id,
                                     share_prefix=tc.share_prefix,
                                     width_bucket=tc.width_bucket,
                                     widths=sorted(trainer.widths),
                                     waste=trainer.width_waste,
                                     patience=tc.width_patience)
    metrics = dict(metrics)
    extra = sum(sequence_denominator(trainer.loss_cfg, n) for n in counts)
    state, tm = trainer.step(state, batches, extra_denom=extra)
  else:
    metrics = {"batch/batches": 0.0, "batch/rows": 0.0, "batch/loss_tokens": 0.0,
               "batch/width": 0.0, "batch/shared_tokens": 0.0}
    state, tm = trainer.step_without_rows(state)
  # Rows of the update per role, the skipped ones included (they are in the update).
  for role in ROLES:
    metrics[f"batch/{role}_rows"] = float(sum(1 for r in rows + skipped if r.role == role))
  metrics["batch/skipped_rows"] = float(len(skipped))
  metrics["batch/skipped_loss_tokens"] = float(sum(counts))
  tm = jax.device_get(tm)
  metrics["time/train"] = time.perf_counter() - t0
  metrics["time/train_compile"] = compile_seconds() - c0
  metrics.update({f"train/{k}": float(v) for k, v in tm.items()})
  return state, metrics
