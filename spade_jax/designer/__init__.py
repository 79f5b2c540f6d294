"""The environment designer's inputs: prompts, corpus grounding, environment memory, hints.

Designer rewards belong to the regret stage (:mod:`spade_jax.selfplay.rewards`); the env
contract the prompts render is :mod:`spade_jax.envs.contract`.
"""

from spade_jax.designer.corpus import SOURCES, Corpus, CorpusConfig, Document, truncate
from spade_jax.designer.hint_audit import HintAudit, audit_hint, number_words
from spade_jax.designer.hints import HINT_SOURCES, Hint, clean_hint, finalize_hint, hint_leaks
from spade_jax.designer.memory import (EnvMemory, MemoryConfig, MemoryRecord, code_hash,
                                       elided_program, render_program)
from spade_jax.designer.prompts import (agent_system_prompt, designer_prompt, hint_prompt,
                                        hinted_observation, judge_prompt)

__all__ = [
    "Corpus", "CorpusConfig", "Document", "EnvMemory", "HINT_SOURCES", "Hint", "HintAudit",
    "MemoryConfig", "MemoryRecord", "SOURCES", "agent_system_prompt", "audit_hint", "clean_hint",
    "code_hash",
    "designer_prompt", "elided_program", "finalize_hint", "hint_leaks", "hint_prompt",
    "hinted_observation", "judge_prompt", "number_words", "render_program", "truncate",
]
