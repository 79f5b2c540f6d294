"""Host memory: have the C allocator keep the pages it frees, so big buffers are not re-faulted.

On CPU, XLA allocates every step's large buffers (a scan's stacked residuals and gradients,
whole-vocabulary logits) through the C allocator and frees them at the end of the step.
glibc hands blocks that large straight back to the kernel (`mmap` / `munmap`, and
per-thread heaps that are unmapped when empty), so the next step touches fresh pages and
the kernel zero-fills each 4 KiB page on its first write: a 100 MB buffer filled with
zeros then runs at the speed of page faults, not of memory.

:func:`keep_freed_memory` asks glibc to serve every block from one heap that it never
trims (`mallopt`: one arena, no `mmap` blocks, no trimming), so a train loop that
allocates the same shapes every step reuses the same, already-mapped pages. The cost is
that the process keeps its peak heap until it exits. `launch.train --keep_freed_memory`
calls it (off by default: on 2 CPU cores the learning recipe's update loses its page
faults but not measurably its time; `experiments/benchmarks/update_malloc.py`).
Elsewhere than Linux with glibc it does nothing.

:func:`map_limit_warning` checks the other host limit a long CPU run meets: XLA:CPU maps
about three regions for each program it compiles and never unmaps them, so a self-play run
that compiles new sampler shapes every iteration passes Linux's default
`vm.max_map_count` (65,530) after some hours and dies in a compile with "LLVM compilation
error: Cannot allocate memory" while most of the RAM is free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

MAP_COUNT_FILE = "/proc/sys/vm/max_map_count"
ENOUGH_MAPS = 262_144
"""A `vm.max_map_count` that a 20-iteration CPU self-play run with evaluations stays well
under (its process peaked at 55k maps)."""


def keep_freed_memory() -> bool:
  """Sets glibc's allocator to keep freed pages (see the module docstring).

  Call it early, before threads allocate (e.g. before JAX starts its backend): arenas that
  threads already own keep their old behaviour.

  Returns:
    True when every setting was taken; False where the C library is not glibc or
    refused one.
  """
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  # A trim threshold of -1 reads as the largest size: the heap's top is never returned.
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
  return all(mallopt(param, value) == 1 for param, value in settings)


def map_limit_warning(backend: str, path: str = MAP_COUNT_FILE,
                      enough: int = ENOUGH_MAPS) -> str | None:
  """A warning when this host's memory-map limit is low for a long run on ``backend``.

  Only XLA:CPU keeps its compiled code in host memory maps, so other backends get None,
  as does a host without ``path`` (not Linux) or with a limit of at least ``enough``.

  Returns:
    The warning, naming the limit, the symptom and the command that raises it; or None.
  """
  if backend != "cpu":
    return None
  try:
    with open(path) as f:
      limit = int(f.read().strip())
  except (OSError, ValueError):
    return None
  if limit >= enough:
    return None
  return (f"vm.max_map_count is {limit:,}: XLA:CPU keeps ~3 memory maps per compiled "
          f"program, so a long run can pass it and die in a compile with 'LLVM compilation "
          f"error: Cannot allocate memory' (or a segfault) with RAM free. Before a run of "
          f"more than a few iterations, raise it: sudo sysctl -w vm.max_map_count={enough}")
