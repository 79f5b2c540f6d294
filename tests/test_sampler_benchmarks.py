"""The accelerator decode benchmark runs end to end on CPU in its smoke mode."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_gpu_decode_smoke_writes_json(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "OUT": str(tmp_path), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  subprocess.run([sys.executable, "-m", "experiments.benchmarks.gpu_decode", "--smoke",
                  "--repeats=1"], cwd=root, env=env, check=True, capture_output=True,
                 timeout=600)
  result = json.loads((tmp_path / "gpu_decode.json").read_text())
  assert result["smoke"] and result["decode_tokens_per_s"] > 0
  assert result["achieved_bandwidth_gb_s"] > 0 and result["cache_len"] >= 32
