r"""Train-step attention: the "blocked" kernel against "matmul" on packed rows.

  python -m experiments.benchmarks.train_attention [--models=mechanism,tiny] \
      [--batch=8] [--length=2560] [--layouts=packed,one] [--repeats=5] [--remat=full]

`ModelConfig.attention` picks the kernel of training (and prefill) attention.
"matmul" forms every row's [T, S] scores; "blocked"
(`attention.blocked_attention`) visits only the key blocks each query block's
mask reaches. For each model and row layout the script jits the gradient of
the log-probability sum the trainer differentiates
(`rl.logprobs.chunked_token_logprobs`, 512-position head chunks) under both
kernels on the same weights and rows, prints how far per-token log-probs and
gradients differ, then times `--repeats` paired calls in alternating order and prints
medians (ms) and the ratio matmul / blocked (> 1: blocked is faster).

Layouts: "packed" fills each row first-fit with segments of 150-1,200 tokens
(as `rl.build_batches` packs designer and agent sequences) and leaves the
rest padding; "one" is one segment over the whole row (causal only).
Models: "mechanism" is the first mechanism experiment's ~10M model, "tiny" the
library's `tiny` preset, "50m" the sampler benchmarks' 50M size.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app, flags

_MODELS = flags.DEFINE_list("models", ["mechanism", "tiny"], "mechanism, tiny or 50m.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows per step.")
_LENGTH = flags.DEFINE_integer("length", 2560, "Tokens per row.")
_LAYOUTS = flags.DEFINE_list("layouts", ["packed", "one"], "Row layouts: packed, one.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed pairs per configuration.")
_REMAT = flags.DEFINE_enum("remat", "full", ["none", "full"],
                           "`ModelConfig.remat` (\"none\" keeps every layer's scores).")
KERNELS = ("matmul", "blocked")


def _config(name: str):
  from spade_jax.models import ModelConfig, get_preset  # pylint: disable=g-import-not-at-top
  if name == "mechanism":  # the first mechanism experiment's model, tied embeddings
    from experiments.benchmarks.common import SIZES  # pylint: disable=g-import-not-at-top
    return ModelConfig(**SIZES["mechanism"], tie_embeddings=True,
                       max_position_embeddings=4096)
  if name == "tiny":
    return get_preset("tiny")
  if name == "50m":
    from experiments.benchmarks.common import model_config  # pylint: disable=g-import-not-at-top
    return model_config("50m")
  raise app.UsageError(f"--models: unknown model {name!r}; expected mechanism, tiny or 50m.")


def _rows(layout: str, B: int, T: int, seed: int):
  """segment ids and positions [B, T] of the layout."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  seg, pos = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  if layout == "one":
    seg[:] = 1
    pos[:] = np.arange(T)
    return seg, pos
  if layout != "packed":
    raise app.UsageError(f"--layouts: unknown layout {layout!r}; expected packed or one.")
  rng = np.random.default_rng(seed)
  for b in range(B):
    at, sid = 0, 1
    while True:
      n = int(rng.integers(150, 1201))
      if at + n > T:
        break
      seg[b, at:at + n], pos[b, at:at + n] = sid, np.arange(n)
      at, sid = at + n, sid + 1
  return seg, pos


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.rl.logprobs import chunked_token_logprobs  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  B, T = _BATCH.value, _LENGTH.value
  for name in _MODELS.value:
    base = _config(name)
    params = init_params(jax.random.key(0), base)
    for layout in _LAYOUTS.value:
      seg, pos = _rows(layout, B, T, seed=1)
      rng = np.random.default_rng(2)
      toks = jnp.asarray(rng.integers(1, base.vocab_size, (B, T)), jnp.int32)
      seg, pos = jnp.asarray(seg), jnp.asarray(pos)
      fns = {}
      for kernel in KERNELS:
        cfg = dataclasses.replace(base, attention=kernel, remat=_REMAT.value)

        def loss(p, cfg=cfg):
          logps = chunked_token_logprobs(p, cfg, toks, pos, seg)
          return logps.sum(), logps

        fns[kernel] = jax.jit(jax.value_and_grad(loss, has_aux=True))
      t0 = time.perf_counter()
      out = {k: jax.block_until_ready(f(params)) for k, f in fns.items()}
      compile_s = time.perf_counter() - t0
      ((_, lm), gm), ((_, lb), gb) = out["matmul"], out["blocked"]
      rel = max(float(jnp.abs(a - b).max() / (jnp.abs(a).max() + 1e-30))
                for a, b in zip(jax.tree.leaves(gm), jax.tree.leaves(gb)))
      times = {k: [] for k in KERNELS}
      for r in range(_REPEATS.value):
        for kernel in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
          t0 = time.perf_counter()
          jax.block_until_ready(fns[kernel](params))
          times[kernel].append((time.perf_counter() - t0) * 1e3)
      med = {k: statistics.median(v) for k, v in times.items()}
      real = int((np.asarray(seg) > 0).sum())
      print(f"{name:9s} {layout:6s} {B} x {T} ({real / (B * T):.0%} tokens real): "
            f"matmul {med['matmul']:9.1f} ms  blocked {med['blocked']:9.1f} ms  "
            f"matmul/blocked {med['matmul'] / med['blocked']:5.2f}x  "
            f"min {min(times['matmul']):.0f} / {min(times['blocked']):.0f} ms  "
            f"logp max diff {float(jnp.abs(lm - lb).max()):.1e}  "
            f"grad max rel diff {rel:.1e}  remat {_REMAT.value}  (compile+first {compile_s:.0f} s)", flush=True)


if __name__ == "__main__":
  app.run(main)
