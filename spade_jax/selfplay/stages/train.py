"""The train stage: the credited rows packed into GRPO batches and one update."""

from __future__ import annotations

import time

import jax

from spade_jax.metrics import compile_seconds
from spade_jax.rl import TrainState
from spade_jax.selfplay.batch import Row, build_batches


def train(trainer, state: TrainState, rows: list[Row],
          pad_id: int) -> tuple[TrainState, dict[str, float]]:
  """Packs `rows` (`batch.build_batches`) and runs one update of `trainer`.

  Returns:
    (the new train state, the packing's and the update's metrics, `time/train` and
    `time/train_compile`, the part of it spent compiling).
  """
  t0, c0 = time.perf_counter(), compile_seconds()
  tc = trainer.train_cfg
  batches, metrics = build_batches(rows, tc.batch_size, tc.seq_len, pad_id,
                                   share_prefix=tc.share_prefix,
                                   width_bucket=tc.width_bucket,
                                   widths=sorted(trainer.widths),
                                   waste=trainer.width_waste,
                                   patience=tc.width_patience)
  metrics = dict(metrics)
  state, tm = trainer.step(state, batches)
  tm = jax.device_get(tm)
  metrics["time/train"] = time.perf_counter() - t0
  metrics["time/train_compile"] = compile_seconds() - c0
  metrics.update({f"train/{k}": float(v) for k, v in tm.items()})
  return state, metrics
