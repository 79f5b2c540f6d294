"""Benchmark scripts run end to end on CPU (the accelerator one in its smoke mode)."""

import json
import os
import subprocess
import sys

import pytest


def _run(module: str, *args: str, **env: str) -> str:
  """Runs `python -m experiments.benchmarks.<module> args` on one CPU device; its stdout."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1", **env}
  return subprocess.run([sys.executable, "-m", f"experiments.benchmarks.{module}", *args],
                        cwd=root, env=env, check=True, capture_output=True, text=True,
                        timeout=600).stdout


@pytest.mark.slow
def test_gpu_decode_smoke_writes_json(tmp_path):
  _run("gpu_decode", "--smoke", "--repeats=1", OUT=str(tmp_path))
  rows = json.loads((tmp_path / "gpu_decode.json").read_text())
  assert [r["decode_attention"] for r in rows] == ["auto", "whole"]
  for r in rows:
    assert r["smoke"] and r["decode_tokens_per_s"] > 0 and r["same_tokens_as_first"]
    assert r["achieved_bandwidth_gb_s"] > 0 and r["cache_len"] >= 32


@pytest.mark.slow
def test_decode_layout_benchmark_runs_and_layouts_agree():
  out = _run("decode_layout", "--models=tiny", "--batches=4", "--new=8", "--repeats=1")
  assert "tiny  batch   4:" in out and "same tokens True" in out


@pytest.mark.slow
def test_prefill_attention_benchmark_runs_and_formulations_agree():
  out = _run("prefill_attention", "--models=tiny", "--batch=2", "--chunk=16", "--spans=32",
             "--repeats=2")
  line = next(l for l in out.splitlines() if l.startswith("tiny  batch 2 chunk 16 span    32"))
  assert float(line.split("max logit diff")[1]) < 1e-4


@pytest.mark.slow
def test_decode_attention_benchmark_runs_and_variants_agree():
  out = _run("decode_attention", "--models=tiny", "--configs=2x200x100", "--repeats=1")
  assert "tiny  batch   2 prompt  200 new  100 cache   512:" in out
  assert "same tokens True" in out


@pytest.mark.slow
def test_sampler_benchmark_checks_tokens_and_load(tmp_path):
  out = _run("sampler", "--models=tiny", "--batches=2", "--prompts=16", "--new=8",
             "--repeats=2", "--retries=0", "--peers=transformers", f"--json={tmp_path}/s.json")
  line = next(l for l in out.splitlines() if l.startswith("tiny  batch   2"))
  assert "ours/transformers" in line and "TOKENS DIFFER" not in line
  row = json.loads((tmp_path / "s.json").read_text())[0]
  assert row["same_tokens_as_transformers"] and row["rounds"] == 2
  lo, med, hi = row["ours_tok_s"]
  assert 0 < lo <= med <= hi


@pytest.mark.slow
def test_rollout_benchmark_schedules_agree():
  out = _run("rollout", "--models=tiny", "--episodes=4", "--slots=2", "--turns=2",
             "--turn_tokens=8", "--repeats=1", "--max_len=512", "--step_ms=5,20", "--cohorts=2")
  rows = [l for l in out.splitlines() if l.startswith("tiny ")]
  assert [("5 ms steps" in l, "20 ms steps" in l) for l in rows] == [(True, False),
                                                                      (False, True)]
  assert all("same transcripts True (ids True, max |d log-prob|" in l and "speed-up" in l
             for l in rows)
  assert sum(l.strip().startswith("2 cohorts:") for l in out.splitlines()) == 2
  split = [l for l in out.splitlines() if "decode" in l and "steps" in l]
  assert len(split) == 2 and all(" 0 calls" not in l for l in split)


@pytest.mark.slow
def test_train_attention_benchmark_runs_and_kernels_agree():
  out = _run("train_attention", "--models=tiny", "--batch=2", "--length=600",
             "--layouts=packed", "--repeats=1", "--remat=none")
  line = next(l for l in out.splitlines() if l.startswith("tiny      packed 2 x 600"))
  assert float(line.split("logp max diff")[1].split()[0]) < 1e-4
  assert float(line.split("grad max rel diff")[1].split()[0]) < 1e-4


@pytest.mark.slow
def test_sampling_rules_benchmark_runs_and_filters_agree():
  out = _run("sampling_rules", "--models=tiny", "--batches=4", "--new=8", "--repeats=1",
             "--calls=5")
  assert "vocab    512 batch   4:" in out and "same ids in 5 draws: True" in out
  assert "tiny      batch   4: greedy" in out
