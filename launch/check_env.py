r"""Validates one env program file and shows its solution play.

  python -m launch.check_env PROGRAM.py [--setting=games|tool_use] [--episodes=K] [--json] \
      [--unsafe_skip_static_checks]

PROGRAM.py may hold raw source or model output with a ```python block. Prints
the validation verdict and the transcript of ``solution()`` played on seeds
0..K-1 (when the program has one); exits 1 when the program is invalid.
"""

import dataclasses
import json

from absl import app, flags

from spade_jax import console

from spade_jax.envs import (SETTINGS, ValidationConfig, extract_program, play_solutions,
                            validate_program)
from spade_jax.envs.program import env_class_name
from spade_jax.sandbox import EnvPool, SandboxConfig

_EPISODES = flags.DEFINE_integer("episodes", 1, "Solution plays to show (seeds 0..K-1).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
_SKIP_STATIC = flags.DEFINE_bool(
    "unsafe_skip_static_checks", False,
    "Skip the static import/escape filter (the sandbox still isolates the program).")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 25, "max_turns passed to the program.")
_SETTING = flags.DEFINE_string(
    "setting", None, "games or tool_use (default: tool_use when the program defines "
    "tool_<name> methods and no step(), else games).")
_MODE = flags.DEFINE_enum("sandbox_mode", "best_effort", ["best_effort", "strict", "none"],
                          "Sandbox isolation mode.")


def _print_episode(ep) -> None:
  status = "SOLVED" if ep.solved else "not solved"
  if ep.reason:
    status += f" ({ep.reason}: {ep.detail})"
  print(f"\n--- solution play, seed {ep.seed}: {status}")
  for action, obs, reward, term, trunc in ep.steps:
    if action is not None:
      print(f">>> {action}")
    print(obs)
    if action is not None:
      print(f"    [reward={reward:g} terminated={term} truncated={trunc}]")


def _guess_setting(text: str) -> str:
  source = extract_program(text) or text
  if env_class_name(source) is None and env_class_name(source, tools=True) is not None:
    return "tool_use"
  return "games"


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    raise app.UsageError(f"expected exactly one PROGRAM.py argument, got {argv[1:]}")
  with open(argv[1], encoding="utf-8") as f:
    text = f.read()
  setting = _SETTING.value or _guess_setting(text)
  SETTINGS.check(setting)
  cfg = ValidationConfig(max_turns=_MAX_TURNS.value, skip_static_checks=_SKIP_STATIC.value,
                         sandbox=SandboxConfig(mode=_MODE.value), setting=setting)
  with EnvPool(dataclasses.replace(cfg.sandbox, num_workers=0)) as pool:
    verdict = validate_program(text, pool, cfg)
    episodes = []
    if verdict.source and verdict.has_solution and verdict.reason not in (
        "no_code", "too_large", "syntax", "forbidden"):
      episodes = play_solutions(verdict.source, pool, range(max(0, _EPISODES.value)),
                                _MAX_TURNS.value, setting)
  if _JSON.value:
    out = {k: v for k, v in dataclasses.asdict(verdict).items() if k != "source"}
    out["episodes"] = [dataclasses.asdict(e) for e in episodes]
    print(json.dumps(out, indent=2, default=str))
  else:
    state = "VALID" if verdict.valid else f"INVALID ({verdict.reason})"
    print(f"{argv[1]}: {state} setting={setting} class={verdict.class_name} "
          f"solution={verdict.has_solution} "
          f"hint={verdict.has_hint}")
    if verdict.detail:
      print(f"detail: {verdict.detail}")
    print("timings: " + ", ".join(f"{k}={v * 1000:.0f}ms" for k, v in verdict.timings.items()))
    if verdict.hint:
      print(f"hint: {verdict.hint}")
    for ep in episodes:
      _print_episode(ep)
  return 0 if verdict.valid else 1


if __name__ == "__main__":
  console.run(main)
