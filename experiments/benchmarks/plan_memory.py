"""Plans the memory of the full GRPO train step on a virtual device mesh.

Lowers and compiles `Trainer`'s update for a model preset on N virtual CPU
devices with a named mesh, from abstract inputs only (`jax.eval_shape`
state, `ShapeDtypeStruct` batch, both carrying their shardings): nothing is
allocated. Prints the per-device sizes from `compiled.memory_analysis()`, the
compile time and whether the step fits in the per-chip HBM.

  python experiments/benchmarks/plan_memory.py                 # 4B, 8B, 30B-A3B on 64
  python experiments/benchmarks/plan_memory.py --preset=qwen3_4b --devices=32 \\
      --seq_len=8192 --per_device_batch=1 --mesh=fsdp:-1 --rules=fsdp

The CPU compiler's buffer assignment stands in for the TPU's: it is a close
guide for parameters, optimizer state and activations kept for the backward
pass, not an exact TPU figure (fusion and layouts differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

# Paper recipes (DESIGN.md section 5): KL 0.005 for Qwen3-8B, 0 otherwise.
RECIPE_KL = {"qwen3_4b": 0.0, "qwen3_8b": 0.005, "qwen3_30b_a3b": 0.0}
GIB = 2 ** 30


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", action="append",
                 help="model preset (repeatable); default qwen3_4b, qwen3_8b, qwen3_30b_a3b")
  p.add_argument("--devices", type=int, default=64, help="virtual CPU devices")
  p.add_argument("--mesh", default="fsdp:-1",
                 help="mesh axis sizes, e.g. 'fsdp:-1' or 'fsdp:16,tensor:4'")
  p.add_argument("--rules", default="",
                 help="sharding rule set (default: fsdp, fsdp_tensor_expert for MoE)")
  p.add_argument("--seq_len", type=int, default=8192)
  p.add_argument("--per_device_batch", type=int, default=1,
                 help="sequences per device per micro-batch")
  p.add_argument("--microbatches", type=int, default=1)
  p.add_argument("--logprob_chunk", type=int, default=1024)
  p.add_argument("--remat", default="full")
  p.add_argument("--moe_impl", default="blocked",
                 help="MoE expert compute: blocked (default; the CPU compiler expands "
                      "ragged_dot densely over all experts, so 'ragged' plans are "
                      "not representative of TPU/GPU)")
  p.add_argument("--param_dtype", default="float32",
                 help="master weights (float32: lr 1e-6 updates vanish in bfloat16)")
  p.add_argument("--kl", type=float, default=None,
                 help="KL coefficient (default: the paper recipe of the preset)")
  p.add_argument("--hbm_gib", type=float, default=95.0, help="memory per chip")
  return p.parse_args(argv)


def plan(name: str, args) -> dict:
  """Compiles the step for preset `name`; returns the memory figures in bytes."""
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS is set)
  from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
  from spade_jax.models import get_preset, num_params  # pylint: disable=g-import-not-at-top

  cfg = get_preset(name, param_dtype=args.param_dtype, remat=args.remat)
  if cfg.num_experts:
    cfg = dataclasses.replace(cfg, moe_impl=args.moe_impl)
  sizes = dict(kv.split(":") for kv in args.mesh.split(",") if kv)
  mesh_cfg = parallel.MeshConfig(
      **{k: int(v) for k, v in sizes.items()},
      **({} if "data" in sizes else {"data": 1}),
      rules=args.rules or ("fsdp_tensor_expert" if cfg.num_experts else "fsdp"))
  mesh = parallel.make_mesh(mesh_cfg, jax.devices()[:args.devices])
  kl = RECIPE_KL.get(name, 0.0) if args.kl is None else args.kl
  batch = args.per_device_batch * args.devices * args.microbatches
  trainer = rl.Trainer(
      cfg, rl.TrainConfig(batch, args.seq_len, args.microbatches, args.logprob_chunk),
      rl.LossConfig(kl_coef=kl), rl.OptimizerConfig(), mesh,
      parallel.RULE_SETS[mesh_cfg.rules])
  t0 = time.perf_counter()
  lowered = trainer.lower()
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  ma = compiled.memory_analysis()
  out = {
      "preset": name, "params": num_params(cfg), "mesh": dict(mesh.shape),
      "rules": mesh_cfg.rules, "batch": batch, "seq_len": args.seq_len,
      "microbatches": args.microbatches, "kl": kl,
      "argument": ma.argument_size_in_bytes, "output": ma.output_size_in_bytes,
      "alias": ma.alias_size_in_bytes, "temp": ma.temp_size_in_bytes,
      "code": ma.generated_code_size_in_bytes,
      "lower_s": t1 - t0, "compile_s": t2 - t1,
  }
  # Donated state aliases its outputs: live = arguments + temporaries +
  # outputs that are not aliased to an argument.
  out["peak"] = out["argument"] + out["temp"] + out["output"] - out["alias"]
  out["fits"] = out["peak"] <= args.hbm_gib * GIB
  return out


def _show(r, hbm):
  g = lambda k: f"{r[k] / GIB:8.2f} GiB"
  mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1)
  print(f"\n== {r['preset']}: {r['params'] / 1e9:.2f}B params, mesh {mesh} "
        f"({r['rules']}), batch {r['batch']} x {r['seq_len']} tokens, "
        f"{r['microbatches']} micro-batch(es), KL {r['kl']}")
  print(f"  lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s")
  print(f"  per device: arguments {g('argument')} | outputs {g('output')} | "
        f"aliased {g('alias')} | temporaries {g('temp')}")
  print(f"  peak ~ {g('peak')} of {hbm:.0f} GiB: "
        f"{'FITS' if r['fits'] else 'DOES NOT FIT'}", flush=True)


def main(argv=None):
  args = _parse(argv)
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  if "jax" in sys.modules:
    raise RuntimeError("plan_memory must set XLA_FLAGS before jax is imported; "
                       "run it as a script.")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
  presets = args.preset or ["qwen3_4b", "qwen3_8b", "qwen3_30b_a3b"]
  results = []
  for name in presets:
    try:
      r = plan(name, args)
    except Exception as e:  # pylint: disable=broad-except  (report, go on)
      print(f"\n== {name}: FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
      continue
    _show(r, args.hbm_gib)
    results.append(r)
  return results


if __name__ == "__main__":
  main()
