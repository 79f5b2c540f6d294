"""Env programs: the contract, settings, extraction, validation, program texts, gymnasium adapter.

Public API::

  from spade_jax.envs import (extract_program, validate_program, ValidationConfig,
                              Verdict, REASONS, builtin_programs, load_program)

Importing this package registers the gymnasium env ``spade_jax/Program-v0``.
"""

from spade_jax.envs.contract import (ALLOWED_IMPORTS, COMMON_RULES, MAX_SOURCE_BYTES, REASONS,
                                     SETTINGS, SKILLS, TOOL_DOMAINS, TOOL_TASK_TYPES,
                                     VALIDATION_REASONS, Setting, check_skill, skill_index)
from spade_jax.envs.gym_adapter import ENV_ID, ProgramEnv, UnicodeText
from spade_jax.envs.program import check_static, extract_program
from spade_jax.envs.programs import builtin_program, builtin_programs, load_program
from spade_jax.envs.tools import start
from spade_jax.envs.replay import Episode, play_solutions
from spade_jax.envs.validate import (ValidationConfig, Verdict, random_actions,
                                     validate_many, validate_program)

__all__ = [
    "ALLOWED_IMPORTS", "COMMON_RULES", "ENV_ID", "Episode", "MAX_SOURCE_BYTES",
    "ProgramEnv", "REASONS", "SETTINGS", "SKILLS", "Setting", "TOOL_DOMAINS",
    "TOOL_TASK_TYPES", "UnicodeText",
    "VALIDATION_REASONS", "ValidationConfig", "Verdict", "builtin_program", "builtin_programs",
    "check_skill", "check_static", "extract_program", "load_program", "play_solutions",
    "random_actions",
    "skill_index", "start", "validate_many", "validate_program",
]
