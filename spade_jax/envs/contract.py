"""The env program contract, defined once.

Everything a program is held to lives here: the settings it can be written for
(their skills, how the agent's turn reaches ``step``, what the agent is told),
the modules it may import, its size cap and the reasons a program can be
rejected. The designer prompt (:mod:`spade_jax.designer.prompts`) renders these
constants, the validator (:mod:`spade_jax.envs.validate`) enforces them, and
the sandbox below knows only how a run can fail (:data:`spade_jax.sandbox.FAILURES`).
"""

from __future__ import annotations

import dataclasses

from spade_jax.registry import Registry
from spade_jax.sandbox import FAILURES

# Pure standard-library modules a program may import.
ALLOWED_IMPORTS = ("random", "math", "re", "json", "itertools", "collections", "string",
                   "functools", "heapq", "bisect", "dataclasses", "typing", "fractions",
                   "statistics", "copy", "enum", "operator")
# `from __future__ import ...` is a compiler directive, not a module: always allowed.
COMPILER_DIRECTIVES = ("__future__",)
MAX_SOURCE_BYTES = 64 * 1024
# The tool that ends a tool-use episode.
FINAL_ANSWER_TOOL = "final_answer"

# Why the validator rejects a program. Programs that fail while running (in
# validation or in an episode) carry one of the sandbox's run failures.
VALIDATION_REASONS = ("no_code", "too_large", "syntax", "forbidden", "contract",
                      "nondeterministic", "infeasible", "trivial")
REASONS = VALIDATION_REASONS + tuple(r for r in FAILURES if r not in VALIDATION_REASONS)


@dataclasses.dataclass(frozen=True)
class Setting:
  """A family of environments.

  Attributes:
    name: registry name.
    skills: skill name -> what the skill asks of the player.
    interaction: how the agent's turn text reaches ``step`` (told to the designer).
    agent_rules: how the agent must act (told to the agent).
    action_mode: sandbox action mode: how a turn's text becomes ``step``'s argument.
    doc_words: grounding documents are cut to this many words in the designer prompt
      (reference: 6,000 for games, 4,000 for tool use).
  """
  name: str
  skills: dict[str, str]
  interaction: str
  agent_rules: str
  action_mode: str
  doc_words: int


_GAMES = Setting(
    name="games",
    skills={
        "mathematical reasoning":
            "the player must compute, estimate or prove a quantity: arithmetic with "
            "constraints, number theory, combinatorics, algebraic manipulation.",
        "logical deduction":
            "the player must infer hidden facts from clues or feedback: constraint "
            "puzzles, truth-teller/liar setups, elimination grids, code-breaking.",
        "spatial reasoning":
            "the player must track positions, shapes or movement on a grid or graph: "
            "navigation, tiling, rotations, line-of-sight.",
        "pattern recognition":
            "the player must discover a rule behind sequences, strings or tables and "
            "apply it: next-term prediction, transformation rules, hidden mappings.",
        "optimization":
            "the player must find a best (or good enough) choice under constraints: "
            "scheduling, packing, shortest paths, resource allocation with a scored result.",
        "causal inference":
            "the player must discover which hidden mechanism produces the observations, "
            "by intervening and observing: switches and lights, hidden rules, experiments.",
    },
    interaction=(
        "The agent answers each turn in free text. Only the content of the LAST "
        "\\boxed{...} in its message reaches your environment: `step(action)` receives "
        "that content as a plain string (for example `step(\"17\")` or "
        "`step(\"move left\")`); do not parse \\boxed yourself. If the message has no "
        "\\boxed{...}, `step` receives the whole message, stripped. Treat malformed actions "
        "as a wasted turn (reward 0.0, explain the expected format in the observation) "
        "rather than raising. `solution()` returns the contents of the boxes, one per turn."),
    agent_rules=(
        "Each turn, reason briefly, then give exactly one action as \\boxed{ACTION}. Only "
        "the last \\boxed{...} in your message is sent to the environment, verbatim."),
    action_mode="auto",
    doc_words=6000,
)

_TOOL_USE = Setting(
    name="tool_use",
    skills={
        "API orchestration":
            "the agent must combine several APIs whose outputs feed each other's "
            "inputs, in the right order, to complete a request.",
        "data retrieval":
            "the agent must search, filter and look up records through tools to find "
            "facts that are not given directly.",
        "state modification":
            "the agent must change a stateful system (accounts, files, bookings, "
            "inventories) through tools so that it ends in a requested state.",
        "error recovery":
            "tools fail in realistic, deterministic ways (bad arguments, missing records, "
            "rate limits, stale data); the agent must notice and recover.",
        "tool selection":
            "many similar tools are available and only some fit the request; the agent "
            "must pick the right ones with correct arguments.",
        "multi-step workflows":
            "the request needs a long chain of dependent tool calls with intermediate "
            "checks before the final answer.",
    },
    interaction=(
        "The agent calls tools by writing "
        "<tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call>. `step(action)` "
        "receives the JSON text inside the LAST <tool_call>...</tool_call> of the "
        "agent's message (or the whole message, stripped, if there is none). Your environment parses "
        "it with `json.loads`, runs the named tool against its hidden state and returns "
        "the tool's result (JSON text or an error message) as the next observation. The "
        "observation from `reset` must describe the task and list every tool with its "
        "name, purpose and argument schema, including the tool "
        f"`{FINAL_ANSWER_TOOL}` with arguments {{\"answer\": string}}: calling it ends "
        "the episode (terminated=True) with reward 1.0 if the task is accomplished and "
        "0.0 otherwise. Malformed JSON, unknown tools and bad arguments produce an error "
        "observation with reward 0.0, never an exception. `solution()` returns the JSON "
        "texts of the tool calls, one per turn, ending with the final_answer call."),
    agent_rules=(
        "Each turn, make exactly one tool call as "
        "<tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call> with valid "
        "JSON. Read the tool results carefully. When the task is done, call "
        f"`{FINAL_ANSWER_TOOL}` with your answer; that ends the episode."),
    action_mode="tool_call",
    doc_words=4000,
)

SETTINGS: Registry[Setting] = Registry("setting", {s.name: s for s in (_GAMES, _TOOL_USE)},
                                       field="selfplay.setting")
SKILLS: dict[str, tuple[str, ...]] = {s.name: tuple(s.skills) for s in SETTINGS.values()}


def skill_index(setting: str, skill: str) -> int:
  """Integer id of ``skill`` within its setting (the regret buffer's ``skill`` array)."""
  return SKILLS[SETTINGS.check(setting)].index(check_skill(setting, skill))


def check_skill(setting: str, skill: str) -> str:
  """Returns ``skill`` if ``setting`` has it; raises listing the setting's skills."""
  if skill not in SETTINGS[setting].skills:
    raise ValueError(f"Unknown skill {skill!r} for setting {setting!r}; expected one "
                     f"of {list(SKILLS[setting])}.")
  return skill


__all__ = ["ALLOWED_IMPORTS", "COMPILER_DIRECTIVES", "FINAL_ANSWER_TOOL", "MAX_SOURCE_BYTES",
           "REASONS", "SETTINGS", "SKILLS", "Setting", "VALIDATION_REASONS", "check_skill",
           "skill_index"]
