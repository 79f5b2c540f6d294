"""Sandboxed host workers that run untrusted env programs.

Public API::

  from spade_jax.sandbox import SandboxConfig, EnvPool, CallResult
  with EnvPool(SandboxConfig()) as pool:
    handles = pool.start([source], max_turns=25)
    obs, info = pool.reset_many(handles, seeds=[0])[0].value
    obs, reward, terminated, truncated, info = pool.step_many(handles, ["\\boxed{42}"])[0].value
"""

from spade_jax.sandbox.config import DEFAULT_PREIMPORT, MODES, SandboxConfig
from spade_jax.sandbox.isolation import IsolationPlan, IsolationReport, plan_isolation
from spade_jax.sandbox.pool import (ACTION_MODES, FAILURES, OPTIONAL_METHODS, CallResult,
                                    EnvHandle, EnvPool)

__all__ = [
    "ACTION_MODES", "CallResult", "DEFAULT_PREIMPORT", "EnvHandle", "EnvPool", "FAILURES",
    "IsolationPlan", "IsolationReport", "MODES", "OPTIONAL_METHODS", "SandboxConfig",
    "plan_isolation",
]
