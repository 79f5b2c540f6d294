"""hostmem: freed blocks are not re-faulted; a low memory-map limit is warned about."""

import os
import pathlib
import platform
import subprocess
import sys

import pytest

from spade_jax import hostmem

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Allocates, fills and frees a 64 MiB block five times; prints whether the settings were
# taken and the minor page faults of the last four rounds.
_PROBE = """
import ctypes, resource, sys
from spade_jax import hostmem
taken = hostmem.keep_freed_memory() if sys.argv[1] == "1" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def touch(n=64 << 20):
  p = libc.malloc(n)
  ctypes.memset(p, 1, n)
  libc.free(p)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
  touch()
print(taken, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(keep: bool) -> tuple[str, int]:
  out = subprocess.run([sys.executable, "-c", _PROBE, "1" if keep else "0"], cwd=ROOT,
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.split()
  return out[0], int(out[1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's allocator only")
def test_freed_pages_are_kept_for_the_next_allocation():
  taken, kept = _probe(True)
  _, default = _probe(False)
  assert taken == "True"
  # 4 x 64 MiB of 4 KiB pages faulted again by default; (almost) none once kept.
  assert default > 4 * (64 << 20) // 4096 // 2, default
  assert kept < default // 20, (kept, default)


def test_map_limit_warning_names_the_limit_and_the_fix(tmp_path):
  limit = tmp_path / "max_map_count"
  limit.write_text("65530\n")
  warning = hostmem.map_limit_warning("cpu", str(limit))
  assert "65,530" in warning and "Cannot allocate memory" in warning
  assert f"sysctl -w vm.max_map_count={hostmem.ENOUGH_MAPS}" in warning
  # Other backends keep no compiled code in host maps; a high limit or no file is fine.
  assert hostmem.map_limit_warning("gpu", str(limit)) is None
  limit.write_text(f"{hostmem.ENOUGH_MAPS}\n")
  assert hostmem.map_limit_warning("cpu", str(limit)) is None
  assert hostmem.map_limit_warning("cpu", str(tmp_path / "absent")) is None
  limit.write_text("not a number")
  assert hostmem.map_limit_warning("cpu", str(limit)) is None
