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

# Why the validator rejects a program. Programs that fail while running (in
# validation or in an episode) carry one of the sandbox's run failures.
VALIDATION_REASONS = ("no_code", "too_large", "syntax", "forbidden", "contract",
                      "nondeterministic", "infeasible", "trivial", "reset_gate", "judge",
                      "contaminated")
REASONS = VALIDATION_REASONS + tuple(r for r in FAILURES if r not in VALIDATION_REASONS)


@dataclasses.dataclass(frozen=True)
class Setting:
  """A family of environments.

  Attributes:
    name: registry name.
    skills: skill name -> what the skill asks of the player.
    interaction: how the agent's turns reach the program (told to the designer).
    program_rules: what the program's class must define (the setting's part of the
      contract, told to the designer; :data:`COMMON_RULES` follow it).
    agent_rules: how the agent must act (told to the agent).
    action_mode: sandbox action mode: how a turn's text becomes ``step``'s argument.
    doc_words: grounding documents are cut to this many words in the designer prompt
      (reference: 6,000 for games, 4,000 for tool use).
    tool_harness: programs define tools and tasks, and the tool-use harness
      (template ``tool_harness``) provides ``step`` (docs/METHOD.md §5).
  """
  name: str
  skills: dict[str, str]
  interaction: str
  program_rules: str
  agent_rules: str
  action_mode: str
  doc_words: int
  tool_harness: bool = False


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
    program_rules="""\
- Define exactly one class whose name ends in `Env`. Helper functions and constants at
  module level are allowed.
- `__init__(self, max_turns: int = 25, **kwargs)`; store `max_turns` and end the
  episode with truncated=True once that many steps have been taken.
- `reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]`
  returns (first observation, info dict). It starts a new episode and fully resets the
  hidden state.
- `step(self, action: str) -> tuple[str, float, bool, bool, dict]` returns
  (observation, reward, terminated, truncated, info).
- Rewards are finite floats in [-1, 1]. The terminal reward 1.0 means the episode was
  solved; a failed or unfinished episode never earns 1.0.
- Optional `solution(self) -> list[str]`: a list of actions that solves the episode
  started by the last `reset` when replayed from there. Provide it whenever you can:
  it proves the task is feasible.
- Optional `hint(self) -> str`: privileged guidance for the current episode that
  makes it easier without listing the solution's actions.""",
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
        "The agent sees the tools you declare (their JSON schemas) and the first user "
        "request. Each turn it may call tools, several per turn, by writing "
        "<tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call>; each call runs "
        "your method `tool_<name>(**arguments)` and its return value comes back as a tool "
        "result. Malformed calls, unknown tools and bad arguments come back as errors "
        "(the harness handles them; never raise for them yourself). When the current "
        "request's criterion holds, the next user request is revealed. The episode ends "
        "when the agent replies <answer>done</answer> without a tool call: reward 1.0 if "
        "every request's criterion was met, else 0.0. A turn with neither a call nor an "
        "answer is passed to your optional `respond(text)`, whose return value is the "
        "user's reply (use it to supply a parameter the agent must ask for)."),
    program_rules="""\
- Define exactly one class whose name ends in `Env`, with no `step` method (the harness
  provides it). Helper functions and constants at module level are allowed.
- `__init__(self, max_turns: int = 25, **kwargs)`; store `max_turns`.
- `reset(self, seed: int | None = None, options: dict | None = None)` fully resets the
  hidden state and sets `self.tools`: a list of JSON tool schemas
  ({"name": ..., "description": ..., "parameters": {"type": "object", "properties": {...},
  "required": [...]}}), and `self.tasks`: 3-5 pairs (user request text, criterion), where
  a criterion is a function of no arguments (e.g. a lambda over `self`) that returns True
  once the request has been carried out in the hidden state. Criteria must not raise on
  the reset state and must not already hold there.
- One method `tool_<name>(self, **arguments) -> str` per declared tool; it reads or changes
  the hidden state and returns the result as text (JSON is fine).
- Optional `respond(self, text: str) -> str`: the user's reply to a turn without tool call
  or answer.
- Optional `solution(self) -> list[str]`: agent turns that solve the episode started by the
  last `reset` when replayed from there: tool calls written as
  <tool_call>{...}</tool_call>, ending with "<answer>done</answer>". Provide it whenever
  you can: it proves the task is feasible.
- Optional `hint(self) -> str`: privileged guidance for the current episode that makes it
  easier without listing the solution's turns.""",
    agent_rules=(
        "Call tools with <tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call> "
        "(valid JSON; several calls per turn are allowed) and read their results. New "
        "requests arrive as the earlier ones are done. When every request has been "
        "carried out, reply <answer>done</answer> with no tool call; that ends the task."),
    action_mode="raw",
    doc_words=4000,
    tool_harness=True,
)

# The rules every program follows, after its setting's `program_rules`.
COMMON_RULES = f"""\
- All randomness comes from `random.Random(seed)` created in `reset`; the same seed and
  the same actions must give the same observations and rewards. Never use time,
  global random state, files, network or environment variables.
- Imports are limited to these pure standard-library modules: {", ".join(ALLOWED_IMPORTS)}.
- Observations are plain text, at most a few thousand characters. The source stays
  under {MAX_SOURCE_BYTES // 1024} KiB.
- Random or do-nothing play must not solve the task; a careful player must be able to."""

# docs/METHOD.md §5: the tool-use designer prompt samples one domain and one task type per slot.
TOOL_DOMAINS = (
    "online shop orders and returns", "personal banking", "travel booking",
    "calendar and meeting scheduling", "a file system", "email and contacts",
    "library loans", "restaurant reservations", "warehouse inventory",
    "customer-support tickets")
TOOL_TASK_TYPES = {
    "execute": "the requests ask for actions; the tools change the state accordingly.",
    "read-then-write": "each request needs a lookup first, whose result decides the change "
                       "to make.",
    "missing parameter": "one request leaves out a value the agent must ask for; "
                         "`respond(text)` supplies it when asked.",
    "irrelevant request": "one request asks for something no tool can do; its criterion "
                          "holds only if the agent leaves the state unchanged and says so "
                          "(then the next request follows).",
}


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


__all__ = ["ALLOWED_IMPORTS", "COMMON_RULES", "COMPILER_DIRECTIVES", "MAX_SOURCE_BYTES",
           "REASONS", "SETTINGS", "SKILLS", "Setting", "TOOL_DOMAINS", "TOOL_TASK_TYPES",
           "VALIDATION_REASONS", "check_skill", "skill_index"]
