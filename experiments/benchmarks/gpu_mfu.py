"""Model FLOPs utilisation of the GRPO train step (bf16) on one accelerator.

Random Qwen3-0.6B and 1.7B-shaped models (presets `qwen3_0_6b`,
`qwen3_1_7b`), float32 master weights, bfloat16 compute, one jitted update
(policy forward + backward with chunked log-probs, AdamW) on a fixed batch.
MFU = model FLOPs per step / step time / peak bf16 FLOP/s, with the usual
training count 6 * N_matmul per token plus attention 12 * L * H * E * T per
token (causal attention counted in full, as is customary). Writes JSON to
$OUT (or --out).

  python experiments/benchmarks/gpu_mfu.py                 # on the GPU
  python experiments/benchmarks/gpu_mfu.py --smoke         # tiny, CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# Dense bf16 peak FLOP/s (no sparsity) by device kind substring.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5p": 459e12,
             "TPU v5 lite": 197e12, "TPU v4": 275e12}


def model_flops_per_token(cfg, seq_len: int) -> float:
  """Training FLOPs per token: 6 * matmul params + 12 * L * H * E * T (attention)."""
  d, h, k, e, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
  per_layer = d * h * e + 2 * d * k * e + h * e * d + 3 * d * f
  head = d * cfg.vocab_size
  matmul = cfg.num_layers * per_layer + head
  attention = 12 * cfg.num_layers * h * e * seq_len
  return 6 * matmul + attention


def peak_flops(device) -> float | None:
  kind = getattr(device, "device_kind", "")
  for key, value in PEAK_BF16.items():
    if key.lower() in kind.lower():
      return value
  return None


def measure(preset: str, batch: int, seq_len: int, steps: int, chunk: int,
            remat: str, overrides: dict | None = None) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
  from spade_jax.models import get_preset, num_params  # pylint: disable=g-import-not-at-top

  cfg = get_preset(preset, **{"param_dtype": "float32", "compute_dtype": "bfloat16",
                              "remat": remat, **(overrides or {})})
  dev = jax.devices()[0]
  mesh = parallel.make_mesh(parallel.MeshConfig(), [dev])
  tr = rl.Trainer(cfg, rl.TrainConfig(batch, seq_len, logprob_chunk=chunk),
                  rl.LossConfig(), rl.OptimizerConfig(), mesh,
                  parallel.RULE_SETS["fsdp"])
  state = tr.init_state(jax.random.key(0))
  rng = np.random.default_rng(0)
  b = dict(tokens=rng.integers(0, cfg.vocab_size, (batch, seq_len)).astype(np.int32),
           positions=np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1)),
           segment_ids=np.ones((batch, seq_len), np.int32),
           loss_mask=np.ones((batch, seq_len), bool),
           sampler_logps=np.full((batch, seq_len), -12.0, np.float32),
           advantages=rng.normal(size=batch).astype(np.float32),
           role=np.ones((batch,), np.int32))
  b = {k: jax.device_put(np.broadcast_to(v[:, None], (batch, seq_len)) if v.ndim == 1
                         else v, tr.batch_shardings[k]) for k, v in b.items()}
  t0 = time.perf_counter()
  state, m = tr.step(state, b)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = tr.step(state, b)
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t0)
  step_s = statistics.median(times)
  flops = model_flops_per_token(cfg, seq_len) * batch * seq_len
  peak = peak_flops(dev)
  return {
      "preset": preset, "params": num_params(cfg), "batch": batch, "seq_len": seq_len,
      "device": getattr(dev, "device_kind", str(dev)), "compile_s": compile_s,
      "step_s_median": step_s, "step_s_all": times, "tokens_per_s": batch * seq_len / step_s,
      "model_tflops_per_step": flops / 1e12, "achieved_tflops": flops / step_s / 1e12,
      "peak_tflops": peak / 1e12 if peak else None,
      "mfu": flops / step_s / peak if peak else None,
      "loss": float(m["loss"]), "remat": remat, "logprob_chunk": chunk,
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--presets", default="qwen3_0_6b,qwen3_1_7b")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=4096)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--chunk", type=int, default=1024)
  p.add_argument("--remat", default="full")
  p.add_argument("--smoke", action="store_true",
                 help="tiny model, short batch, CPU-friendly (tests the script)")
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
  if args.smoke:
    runs = [("tiny", 2, 64, 2, 16, "full", None)]
  else:
    runs = [(name, args.batch, args.seq_len, args.steps, args.chunk, args.remat, None)
            for name in args.presets.split(",")]
  results = []
  for name, batch, seq_len, steps, chunk, remat, over in runs:
    r = measure(name, batch, seq_len, steps, chunk, remat, over)
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (unknown peak)"
    print(f"{name}: {r['params'] / 1e9:.2f}B params, {batch}x{seq_len} tokens, "
          f"step {r['step_s_median'] * 1e3:.1f} ms, {r['tokens_per_s']:.0f} tok/s, "
          f"{r['achieved_tflops']:.1f} TFLOP/s, MFU {mfu} on {r['device']}", flush=True)
    results.append(r)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "gpu_mfu.json")
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {path}")
  return results


if __name__ == "__main__":
  main()
