"""spade_jax: SPADE self-play (environment designer + reasoning agent) in JAX.

Importing the package sets one XLA:CPU default before JAX starts its backend:
`--xla_cpu_enable_concurrency_optimized_scheduler=false`. The concurrency
scheduler runs independent small ops side by side, which on a few cores
doubles the time of a decode step (figures in experiments/benchmarks/RESULTS.md).
It only touches the CPU backend; set the flag yourself in XLA_FLAGS to override
it, or SPADE_JAX_XLA_DEFAULTS=0 to leave XLA_FLAGS alone.
"""

import os as _os

_CPU_DEFAULTS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def _set_xla_defaults() -> None:
  if _os.environ.get("SPADE_JAX_XLA_DEFAULTS", "1") == "0":
    return
  flags = _os.environ.get("XLA_FLAGS", "")
  extra = [f for f in _CPU_DEFAULTS if f.split("=")[0] not in flags]
  if extra:
    _os.environ["XLA_FLAGS"] = " ".join([flags] + extra).strip()


_set_xla_defaults()
