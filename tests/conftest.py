"""Test setup: 8 virtual CPU devices so sharding is exercised; no accelerator.

On a busy 2-core machine the 8 device threads of a collective can arrive far
apart; the XLA CPU collective deadlines are raised so a slow thread is not
mistaken for a hang.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_FLAGS = ("--xla_force_host_platform_device_count=8",
          "--xla_cpu_collective_call_terminate_timeout_seconds=1200",
          "--xla_cpu_collective_timeout_seconds=1200")
_current = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_current] + [f for f in _FLAGS if f.split("=")[0] not in _current]).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Recipes' smoke variants build a tiny Hugging Face checkpoint in a cache directory: keep
# it inside this test session (subprocesses and notebook kernels inherit the variable).
if "SPADE_JAX_CACHE" not in os.environ:
  import tempfile  # pylint: disable=g-import-not-at-top
  os.environ["SPADE_JAX_CACHE"] = tempfile.mkdtemp(prefix="spade_jax_cache_")
