"""Test setup: 8 virtual CPU devices so sharding is exercised; no accelerator.

On a busy 2-core machine the 8 device threads of a collective can arrive far
apart; the XLA CPU collective deadlines are raised so a slow thread is not
mistaken for a hang. The suite's programs are small and compiled once or twice,
so XLA:CPU's backend (LLVM) optimisation is off: compiling, not running, is what
the suite waits on (one packed-update test: 28.4 s -> 16.2 s). Numerics are the
same (XLA:CPU keeps fast-math off at every level).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_FLAGS = ("--xla_force_host_platform_device_count=8",
          "--xla_cpu_collective_call_terminate_timeout_seconds=1200",
          "--xla_cpu_collective_timeout_seconds=1200",
          "--xla_backend_optimization_level=0")
_current = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_current] + [f for f in _FLAGS if f.split("=")[0] not in _current]).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order

# Recipes' smoke variants build a tiny Hugging Face checkpoint in a cache directory: keep
# it inside this test session (subprocesses and notebook kernels inherit the variable).
# pytest-xdist workers inherit both directories from the controller, which removes them.
_CACHE = None
if "SPADE_JAX_CACHE" not in os.environ:
  _CACHE = os.environ["SPADE_JAX_CACHE"] = tempfile.mkdtemp(prefix="spade_jax_cache_")
# Compiling dominates the suite on CPU, and many modules (and the CLI subprocesses and notebook
# kernels, which inherit these variables) compile the same small programs again after
# `_release_compiled_programs` drops them. JAX's persistent compilation cache, kept inside this
# session (a fresh directory each run, so every run starts cold), turns those into loads.
# SPADE_JAX_TEST_COMPILE_CACHE=0 turns it off.
_COMPILE_CACHE = None
if (os.environ.get("SPADE_JAX_TEST_COMPILE_CACHE", "1") != "0"
    and "JAX_COMPILATION_CACHE_DIR" not in os.environ):
  _COMPILE_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="spade_jax_xla_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


import gc  # pylint: disable=g-import-not-at-top,g-bad-import-order
import shutil  # pylint: disable=g-import-not-at-top,g-bad-import-order

import jax  # pylint: disable=g-import-not-at-top,g-bad-import-order
import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order


def _mapped_regions() -> int:
  try:
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux
    return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Frees every module's compiled programs when the module ends.

  Each XLA CPU executable holds its own code mappings. A whole suite in one
  process otherwise keeps thousands alive and reaches the kernel's per-process
  map limit (vm.max_map_count, 65530 by default), where the next compile
  crashes with a segmentation fault.
  """
  yield
  jax.clear_caches()
  gc.collect()
  if os.environ.get("SPADE_JAX_TEST_MAPS"):
    with open(os.environ["SPADE_JAX_TEST_MAPS"], "a", encoding="utf-8") as f:
      f.write(f"{_mapped_regions()}\n")


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  for made in (_COMPILE_CACHE, _CACHE):
    if made:
      shutil.rmtree(made, ignore_errors=True)
