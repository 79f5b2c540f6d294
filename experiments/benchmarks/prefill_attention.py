r"""One prefill chunk with each prefill attention kernel (`ModelConfig.attention`).

  python -m experiments.benchmarks.prefill_attention [--models=tiny,50m] \
      [--batch=8] [--chunk=128] [--spans=128,256,512] [--repeats=15]

The model's prefill / extend / training attention is chosen by
`ModelConfig.attention`. The default, "matmul" (`attention.matmul_attention`),
writes both products as batched matmuls over (batch, kv head) with the scores'
length axis minor. "einsum" (`attention.einsum_attention`) writes each product
as one einsum over the same head-major keys ("btkge,bkes->bkgts",
"bkgts,bkse->btkge"), which XLA:CPU computes as [S, T*G] scores and transposes
twice.

For each model size and span (cache entries one chunk attends over, the
chunk being its last `--chunk` of them) the script compiles
`engine.extend_step` once per kernel on the same random weights and
cache, checks that both give the same logits, then times `--repeats` paired
calls in alternating order in one process (this machine's drift cancels in
the paired difference) and prints medians and the median paired change
(matmul - einsum).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app, flags

from experiments.benchmarks.common import model_config

_MODELS = flags.DEFINE_list("models", ["tiny", "50m"], "Model sizes: tiny, 50m.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows in the chunk.")
_CHUNK = flags.DEFINE_integer("chunk", 128, "Tokens per row in the chunk.")
_SPANS = flags.DEFINE_list("spans", ["128", "256", "512"], "Cache entries attended.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Timed pairs per configuration.")
# `ModelConfig.attention` names: the reference first, the default second.
KERNELS = ("einsum", "matmul")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import engine as engine_lib  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  B, C = _BATCH.value, _CHUNK.value
  for size in _MODELS.value:
    cfg = model_config(size)
    params = init_params(jax.random.key(0), cfg)
    rule = SamplingConfig(temperature=0.0, eos_id=-1, pad_id=cfg.vocab_size - 1)
    for span in (int(s) for s in _SPANS.value):
      if span < C:
        raise app.UsageError(f"--spans: {span} is shorter than --chunk={C}.")
      eng = engine_lib.Engine(cfg, params, slots=B, max_len=span, rule=rule,
                              cache_dtype="float32")
      ptr = span - C
      if ptr:
        eng.extend({b: list(range(1, ptr + 1)) for b in range(B)},
                   {b: jax.random.key(b) for b in range(B)})
      state = eng.state
      rng = np.random.default_rng(span)
      tokens = rng.integers(1, cfg.vocab_size - 1, (B, C)).astype(np.int32)
      tv, reset = np.ones((B, C), bool), np.zeros(B, bool)
      keys = jax.random.split(jax.random.key(1), B)
      fns = {}
      for name in KERNELS:
        kcfg = dataclasses.replace(cfg, attention=name)
        fns[name] = jax.jit(lambda p, s, kcfg=kcfg: engine_lib.extend_step(
            p, s, np.int32(ptr), tokens, tv, reset, keys, cfg=kcfg, span=span).logits)
        jax.block_until_ready(fns[name](eng.params, state))
      diff = float(np.abs(np.asarray(fns["einsum"](eng.params, state))
                          - np.asarray(fns["matmul"](eng.params, state))).max())
      times = {name: [] for name in fns}
      for r in range(_REPEATS.value):
        for name in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
          t0 = time.perf_counter()
          jax.block_until_ready(fns[name](eng.params, state))
          times[name].append((time.perf_counter() - t0) * 1e3)
      paired = statistics.median(b - e for b, e in zip(times["matmul"], times["einsum"]))
      old, new = statistics.median(times["einsum"]), statistics.median(times["matmul"])
      print(f"{size:5s} batch {B} chunk {C} span {span:5d}: einsum {old:8.1f} ms  "
            f"matmul {new:8.1f} ms  paired change {paired:+7.1f} ms "
            f"({paired / old * 100:+.0f}%)  max logit diff {diff:.1e}", flush=True)


if __name__ == "__main__":
  app.run(main)
