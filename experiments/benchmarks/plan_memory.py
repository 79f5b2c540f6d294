"""Plans the memory of the full GRPO train step on a virtual device mesh.

Lowers and compiles `Trainer`'s update for a model preset on N virtual CPU
devices with a named mesh, from abstract inputs only (`jax.eval_shape`
state, `ShapeDtypeStruct` batch, both carrying their shardings): nothing is
allocated. Reports the per-device sizes from `compiled.memory_analysis()`,
the largest buffers of the compiled program (from its HLO), the compile time
and whether the step fits in the per-chip HBM.

  python experiments/benchmarks/plan_memory.py          # 4B-2507, 8B, 30B-A3B-2507 on 64
  python experiments/benchmarks/plan_memory.py --preset=qwen3_30b_a3b_instruct_2507 \\
      --mesh=fsdp:8,expert:8 --rules=fsdp_tensor_expert --seq_len=8192 --json=plan.json
  python experiments/benchmarks/plan_memory.py --preset=qwen3_4b --devices=32 \\
      --seq_len=8192 --per_device_batch=1 --mesh=fsdp:-1 --rules=fsdp

Tokens per device = seq_len * per_device_batch (the paper: one 8,192-token
sequence per device). The CPU compiler's buffer assignment stands in for the
TPU's: it is a close guide for parameters, optimizer state and activations
kept for the backward pass, not an exact TPU figure (fusion and layouts
differ). The library entry point is `plan(model, PlanOptions(...))`, usable
from a process whose JAX already has enough devices (the tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from typing import Any, Sequence

DEFAULT_PRESETS = ("qwen3_4b_instruct_2507", "qwen3_8b", "qwen3_30b_a3b_instruct_2507")
GIB = 2 ** 30
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
# Instructions that name an existing buffer rather than allocate one.
_NO_BUFFER = {"parameter", "bitcast", "get-tuple-element", "tuple", "constant",
              "after-all", "partition-id", "replica-id"}


def recipe_kl(name: str) -> float:
  """Paper recipes (DESIGN.md section 5): KL 0.005 for Qwen3-8B, 0 otherwise."""
  key = name.split("/")[-1].lower().replace("-", "_").replace(".", "_")
  return 0.005 if key.startswith("qwen3_8b") else 0.0


@dataclasses.dataclass(frozen=True)
class PlanOptions:
  """One planned step; the defaults are the paper's recipe on 64 chips.

  Attributes:
    devices: devices of the mesh (the first `devices` of `jax.devices()`).
    mesh: mesh axis sizes, e.g. "fsdp:-1" or "fsdp:8,expert:8" (data
      defaults to 1).
    rules: sharding rule set; "" = "fsdp", or "fsdp_tensor_expert" for MoE.
    seq_len: tokens per sequence.
    per_device_batch: sequences per device per micro-batch.
    microbatches: gradient accumulation steps.
    logprob_chunk: positions per chunk of the output projection.
    remat: decoder rematerialisation policy.
    moe_impl: MoE expert compute. "blocked" by default: the CPU compiler
      expands `ragged_dot` densely over all experts, so "ragged" plans are
      not representative of TPU/GPU.
    param_dtype: master weights (float32: lr 1e-6 updates vanish in bf16).
    kl: KL coefficient; None = the preset's paper recipe.
    hbm_gib: memory per chip.
    top: how many of the largest buffers to report.
  """

  devices: int = 64
  mesh: str = "fsdp:-1"
  rules: str = ""
  seq_len: int = 8192
  per_device_batch: int = 1
  microbatches: int = 1
  logprob_chunk: int = 1024
  remat: str = "full"
  moe_impl: str = "blocked"
  param_dtype: str = "float32"
  kl: float | None = None
  hbm_gib: float = 95.0
  top: int = 8


def largest_buffers(hlo_text: str, top: int = 8) -> list[dict[str, Any]]:
  """The largest array-shaped buffers a compiled HLO module allocates.

  Every instruction outside fusion bodies that produces one array (not a
  parameter, bitcast or tuple element) is a buffer candidate; the same shape
  produced by several instructions is reported once with their count.

  Args:
    hlo_text: `compiled.as_text()`.
    top: number of distinct shapes to return.

  Returns:
    [{"shape", "bytes", "count", "example"}], largest first; "example" is
    "instruction (opcode) in computation".
  """
  fused = set(re.findall(r"\bcalls=%?([\w.\-]+)", hlo_text))
  comp = ""
  sizes: dict[str, dict[str, Any]] = {}
  head = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
  inst = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")
  for line in hlo_text.splitlines():
    m = head.match(line)
    if m and " = " not in line:
      comp = m.group(1)
      continue
    if comp in fused:
      continue
    m = inst.match(line)
    if not m or m.group(4) in _NO_BUFFER or m.group(2) not in _DTYPE_BYTES:
      continue
    dims = [int(d) for d in m.group(3).split(",") if d]
    n = _DTYPE_BYTES[m.group(2)]
    for d in dims:
      n *= d
    shape = f"{m.group(2)}[{','.join(map(str, dims))}]"
    entry = sizes.setdefault(shape, {"shape": shape, "bytes": n, "count": 0,
                                     "example": f"{m.group(1)} ({m.group(4)}) in {comp}"})
    entry["count"] += 1
  return sorted(sizes.values(), key=lambda e: -e["bytes"])[:top]


def plan(model, options: PlanOptions = PlanOptions()) -> dict[str, Any]:
  """Compiles the GRPO step for one model on a virtual mesh; returns its memory.

  Args:
    model: a preset name or a `ModelConfig` (its `param_dtype`, `remat` and,
      for MoE, `moe_impl` are overridden by `options`).
    options: mesh, batch and dtype settings.

  Returns:
    A dict: "preset", "params", "mesh" (axis sizes), "rules", "batch",
    "seq_len", "tokens_per_device", "microbatches", "kl", per-device bytes
    "argument", "output", "alias", "temp", "code", "peak" (arguments +
    temporaries + outputs not aliased to a donated argument), "fits"
    (peak <= hbm_gib), "hbm_gib", "largest" (see `largest_buffers`),
    "lower_s", "compile_s".
  """
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS is set)
  from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
  from spade_jax.models import ModelConfig, get_preset, num_params  # pylint: disable=g-import-not-at-top

  o = options
  if isinstance(model, ModelConfig):
    name, cfg = "custom", dataclasses.replace(model, param_dtype=o.param_dtype,
                                              remat=o.remat)
  else:
    name, cfg = model, get_preset(model, param_dtype=o.param_dtype, remat=o.remat)
  if cfg.num_experts:
    cfg = dataclasses.replace(cfg, moe_impl=o.moe_impl)
  if len(jax.devices()) < o.devices:
    raise ValueError(f"plan needs {o.devices} devices but JAX has {len(jax.devices())}; "
                     "run plan_memory.py as a script (it sets "
                     "--xla_force_host_platform_device_count) or lower `devices`.")
  sizes = {}
  for kv in filter(None, o.mesh.split(",")):
    axis, _, size = kv.partition(":")
    if axis not in parallel.MESH_AXES or not size.lstrip("-").isdigit():
      raise ValueError(f"mesh={o.mesh!r}: expected comma-separated axis:size pairs over "
                       f"{parallel.MESH_AXES}, e.g. 'fsdp:8,expert:8'.")
    sizes[axis] = int(size)
  sizes.setdefault("data", 1)
  mesh_cfg = parallel.MeshConfig(
      **sizes, rules=o.rules or ("fsdp_tensor_expert" if cfg.num_experts else "fsdp"))
  mesh = parallel.make_mesh(mesh_cfg, jax.devices()[:o.devices])
  kl = recipe_kl(name) if o.kl is None else o.kl
  batch = o.per_device_batch * o.devices * o.microbatches
  trainer = rl.Trainer(
      cfg, rl.TrainConfig(batch, o.seq_len, o.microbatches, o.logprob_chunk),
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
      "rules": mesh_cfg.rules, "batch": batch, "seq_len": o.seq_len,
      "tokens_per_device": o.seq_len * o.per_device_batch,
      "microbatches": o.microbatches, "kl": kl,
      "argument": ma.argument_size_in_bytes, "output": ma.output_size_in_bytes,
      "alias": ma.alias_size_in_bytes, "temp": ma.temp_size_in_bytes,
      "code": ma.generated_code_size_in_bytes,
      "lower_s": t1 - t0, "compile_s": t2 - t1,
  }
  # Donated state aliases its outputs: live = arguments + temporaries +
  # outputs that are not aliased to an argument.
  out["peak"] = out["argument"] + out["temp"] + out["output"] - out["alias"]
  out["hbm_gib"] = o.hbm_gib
  out["fits"] = out["peak"] <= o.hbm_gib * GIB
  out["largest"] = largest_buffers(compiled.as_text(), o.top)
  return out


def show(r: dict[str, Any]) -> None:
  """Prints one `plan` result."""
  g = lambda k: f"{r[k] / GIB:8.2f} GiB"
  mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1)
  print(f"\n== {r['preset']}: {r['params'] / 1e9:.2f}B params, mesh {mesh} "
        f"({r['rules']}), batch {r['batch']} x {r['seq_len']} tokens "
        f"({r['tokens_per_device']} per device), {r['microbatches']} micro-batch(es), "
        f"KL {r['kl']}")
  print(f"  lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s")
  print(f"  per device: arguments {g('argument')} | outputs {g('output')} | "
        f"aliased {g('alias')} | temporaries {g('temp')}")
  print(f"  peak ~ {g('peak')} of {r['hbm_gib']:.0f} GiB: "
        f"{'FITS' if r['fits'] else 'DOES NOT FIT'}")
  print("  largest buffers: " + "; ".join(
      f"{b['shape']} {b['bytes'] / GIB:.2f} GiB x{b['count']}" for b in r["largest"]),
        flush=True)


def _parse(argv):
  d = PlanOptions()
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", action="append",
                 help=f"model preset (repeatable); default {', '.join(DEFAULT_PRESETS)}")
  p.add_argument("--devices", type=int, default=d.devices, help="virtual CPU devices")
  p.add_argument("--mesh", default=d.mesh,
                 help="mesh axis sizes, e.g. 'fsdp:-1' or 'fsdp:8,expert:8'")
  p.add_argument("--rules", default=d.rules,
                 help="sharding rule set (default: fsdp, fsdp_tensor_expert for MoE)")
  p.add_argument("--seq_len", type=int, default=d.seq_len, help="tokens per sequence")
  p.add_argument("--per_device_batch", type=int, default=d.per_device_batch,
                 help="sequences per device per micro-batch")
  p.add_argument("--microbatches", type=int, default=d.microbatches)
  p.add_argument("--logprob_chunk", type=int, default=d.logprob_chunk)
  p.add_argument("--remat", default=d.remat)
  p.add_argument("--moe_impl", default=d.moe_impl,
                 help="MoE expert compute (see PlanOptions.moe_impl)")
  p.add_argument("--param_dtype", default=d.param_dtype)
  p.add_argument("--kl", type=float, default=None,
                 help="KL coefficient (default: the paper recipe of the preset)")
  p.add_argument("--hbm_gib", type=float, default=d.hbm_gib, help="memory per chip")
  p.add_argument("--top", type=int, default=d.top, help="largest buffers to report")
  p.add_argument("--json", default="", help="also write the results here as JSON")
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  args = _parse(argv)
  if "jax" in sys.modules:
    raise RuntimeError("plan_memory must set XLA_FLAGS before jax is imported; run it "
                       "as a script, or call `plan` from a process with enough devices.")
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
  options = PlanOptions(**{f.name: getattr(args, f.name)
                           for f in dataclasses.fields(PlanOptions)})
  results = []
  for name in args.preset or DEFAULT_PRESETS:
    try:
      r = plan(name, options)
    except Exception as e:  # pylint: disable=broad-except  (report, go on)
      print(f"\n== {name}: FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
      results.append({"preset": name, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
      continue
    show(r)
    results.append(r)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return results


if __name__ == "__main__":
  main()
