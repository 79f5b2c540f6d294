"""plan_memory: the train-step memory planner, on the tiny MoE preset.

The 2-device plan runs through the command line (JSON output), the 8-device
ones in this process through `plan`. At a fixed number of tokens per device
the expert-parallel dispatch's buffers must not grow with the device count;
the global dispatch's do (the contrast shows the check can fail).
"""

import json
import os
import subprocess
import sys

import pytest

from experiments.benchmarks import plan_memory
from spade_jax.models import moe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = dict(seq_len=128, logprob_chunk=64, top=4)
FIELDS = {"preset", "params", "mesh", "rules", "batch", "seq_len", "tokens_per_device",
          "microbatches", "kl", "argument", "output", "alias", "temp", "code", "peak",
          "hbm_gib", "fits", "largest", "lower_s", "compile_s"}


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
  out = tmp_path_factory.mktemp("plan") / "plan.json"
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in f)
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "benchmarks", "plan_memory.py"),
         "--preset=tiny_moe", "--devices=2", "--mesh=expert:2",
         f"--seq_len={COMMON['seq_len']}", f"--logprob_chunk={COMMON['logprob_chunk']}",
         f"--top={COMMON['top']}", f"--json={out}"]
  proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "FITS" in proc.stdout and "largest buffers" in proc.stdout
  (result,) = json.loads(out.read_text())
  return result


@pytest.fixture(scope="module")
def eight_devices():
  return plan_memory.plan("tiny_moe", plan_memory.PlanOptions(
      devices=8, mesh="fsdp:4,expert:2", **COMMON))


def test_report_fields(two_devices, eight_devices):
  for r, n, mesh in ((two_devices, 2, {"expert": 2}),
                     (eight_devices, 8, {"fsdp": 4, "expert": 2})):
    assert FIELDS <= set(r)
    assert {k: v for k, v in r["mesh"].items() if v > 1} == mesh
    assert r["rules"] == "fsdp_tensor_expert" and r["preset"] == "tiny_moe"
    assert r["batch"] == n and r["tokens_per_device"] == COMMON["seq_len"]
    assert r["peak"] == r["argument"] + r["temp"] + r["output"] - r["alias"] > 0
    assert r["fits"] and r["compile_s"] > 0
    sizes = [b["bytes"] for b in r["largest"]]
    assert len(sizes) == COMMON["top"] and sizes == sorted(sizes, reverse=True)
    assert all(b["count"] >= 1 and "[" in b["shape"] for b in r["largest"])


def test_expert_parallel_buffers_do_not_grow_with_devices(two_devices, eight_devices):
  assert eight_devices["largest"][0]["bytes"] <= two_devices["largest"][0]["bytes"]
  assert eight_devices["temp"] <= 1.1 * two_devices["temp"]


def test_global_dispatch_buffers_grow_with_devices(monkeypatch, eight_devices):
  monkeypatch.setattr(moe, "_expert_parallel_layout", lambda *args: None)
  global_ = plan_memory.plan("tiny_moe", plan_memory.PlanOptions(
      devices=8, mesh="fsdp:4,expert:2", **COMMON))
  assert global_["largest"][0]["bytes"] >= 2 * eight_devices["largest"][0]["bytes"]
  assert global_["temp"] > eight_devices["temp"]


def test_largest_buffers_skips_fusion_bodies_and_aliases():
  hlo = """HloModule m

%fused_computation (p: f32[1024,1024]) -> f32[1024,1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  ROOT %big = f32[1024,1024]{1,0} multiply(%p, %p)
}

ENTRY %main (a: f32[16,8]) -> f32[16,8] {
  %a = f32[16,8]{1,0} parameter(0)
  %b = bf16[64,2]{1,0} convert(%a)
  %c = f32[16,8]{1,0} fusion(%a), kind=kLoop, calls=%fused_computation
  %d = f32[16,8]{1,0} add(%c, %c)
  ROOT %e = f32[128]{0} bitcast(%d)
}
"""
  got = plan_memory.largest_buffers(hlo, top=5)
  assert [(b["shape"], b["bytes"], b["count"]) for b in got] == [
      ("f32[16,8]", 512, 2), ("bf16[64,2]", 256, 1)]
  assert got[0]["example"] == "c (fusion) in main"
