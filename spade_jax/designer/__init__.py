"""The environment designer: prompts, corpus grounding, environment memory, hints, rewards.

Public names are re-exported lazily (PEP 562) so that ``import spade_jax.designer`` stays
cheap and ``python -m spade_jax.designer.prompts`` runs its module cleanly.
"""

import importlib

_EXPORTS = {
    "corpus": ("Corpus", "CorpusConfig", "Document", "SOURCES", "truncate"),
    "hints": ("HINT_SOURCES", "Hint", "check_hint_source", "clean_hint", "finalize_hint",
              "hint_leaks", "policy_hint_prompt"),
    "memory": ("EnvMemory", "MemoryConfig", "MemoryRecord", "code_hash", "render_program"),
    "prompts": ("ALLOWED_IMPORTS", "FINAL_ANSWER_TOOL", "SETTINGS", "SKILLS",
                "agent_system_prompt", "designer_prompt",
                "get_setting",
                "hint_prompt", "skill_index"),
    "rewards": ("EnvStats", "RewardConfig", "RewardOutput", "agent_advantages",
                "compute_rewards", "designer_rewards", "plateau", "register_variant",
                "variants"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
  if name in _WHERE:
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(__all__))
