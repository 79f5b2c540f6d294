"""Env program extraction, static checks and validation verdicts."""

import dataclasses
import pathlib

import pytest

from spade_jax.envs import (REASONS, ValidationConfig, Verdict, builtin_programs, check_static,
                            extract_program, validate_many, validate_program)
from spade_jax.sandbox import EnvPool, SandboxConfig

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "programs"
CFG = ValidationConfig(sandbox=SandboxConfig(num_workers=4, call_timeout_s=2.0,
                                             self_test=False))


def fixture(name: str) -> str:
  return (FIXTURES / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def pool():
  with EnvPool(CFG.sandbox) as p:
    yield p


# ---- extraction ------------------------------------------------------------------


def test_extract_prefers_largest_env_block():
  small = "class AEnv:\n  pass"
  big = "import random\n\nclass BigEnv:\n  def reset(self):\n    pass\n"
  text = (f"Here is a helper:\n```python\ndef f():\n  return 1\n```\nFirst try:\n"
          f"```python\n{small}\n```\nFinal:\n```py\n{big}```\nDone.")
  assert extract_program(text).strip() == big.strip()


def test_extract_variants():
  src = "class XEnv:\n  def step(self, a):\n    return a\n"
  assert extract_program(src) == src.strip("\n")
  assert extract_program(f"<think>```python\nclass OldEnv: pass\n```</think>\n```python\n"
                         f"{src}```") == src.strip("\n")
  assert extract_program(f"```python\n{src}") == src.strip("\n")  # cut off before fence end
  assert extract_program("no code here at all") is None
  assert extract_program("") is None
  assert extract_program("```text\nhello\n```") is None


def test_verdict_reason_is_checked():
  with pytest.raises(ValueError, match="expected one of"):
    Verdict(False, "exploded")
  assert set(REASONS) >= {"no_code", "too_large", "syntax", "forbidden", "contract",
                          "nondeterministic", "infeasible", "trivial", "timeout", "memory",
                          "crash", "output_too_large"}


# ---- static checks ----------------------------------------------------------------

_BASE = ("class GameEnv:\n  def reset(self, seed=None, options=None):\n    return '', {}\n"
         "  def step(self, action):\n    return '', 0.0, True, False, {}\n")


@pytest.mark.parametrize("prefix,reason", [
    ("import os\n", "forbidden"),
    ("from subprocess import run\n", "forbidden"),
    ("from . import x\n", "forbidden"),
    ("x = ().__class__.__base__.__subclasses__()\n", "forbidden"),
    ("f = eval\n", "forbidden"),
    ("y = getattr(int, '__globals__', None)\n", "forbidden"),
    ("z = open('/etc/passwd')\n", "forbidden"),
    ("def f(:\n", "syntax"),
    ("import random, math, collections.abc\nfrom typing import Any\n", None),
    ("w = getattr(int, 'real')\nv = self_name = type(1).__name__\n", None),
])
def test_static_checks(prefix, reason):
  got, detail, name = check_static(prefix + _BASE)
  assert got == reason, detail
  if reason is None:
    assert name == "GameEnv"


def test_static_contract_and_size():
  assert check_static("class Game:\n  pass\n")[0] == "contract"
  assert check_static("class OnlyResetEnv:\n  def reset(self): pass\n")[0] == "contract"
  inherited = ("class BaseEnv:\n  def reset(self): pass\n  def step(self, a): pass\n"
               "class ChildEnv(BaseEnv):\n  pass\n")
  assert check_static(inherited) == (None, "", "ChildEnv")
  assert check_static("#" * (65 * 1024) + "\n" + _BASE)[0] == "too_large"


# ---- dynamic verdicts --------------------------------------------------------------


def test_builtin_programs_are_valid(pool):
  programs = builtin_programs()
  assert len(programs) >= 4
  verdicts = validate_many(list(programs.values()), pool, CFG)
  for name, v in zip(programs, verdicts):
    assert v.valid, (name, v.reason, v.detail)
    assert v.has_solution and v.has_hint and v.hint
    assert v.class_name.endswith("Env")
    last = v.transcript[-1]
    assert last[2] == 1.0 and last[3] is True
    assert {"extract", "static", "load", "play", "total"} <= set(v.timings)


@pytest.mark.parametrize("name,reason", [
    ("valid_counter", None),
    ("reference_style", None),
    ("infeasible", "infeasible"),
    ("trivial", "trivial"),
    ("nondeterministic", "nondeterministic"),
    ("no_truncation", "contract"),
])
def test_fixture_verdicts(pool, name, reason):
  v = validate_program(fixture(name), pool, CFG)
  assert v.reason == reason, v.detail
  assert v.valid == (reason is None)
  assert v.source is not None and v.class_name is not None


def test_fenced_model_output_validates(pool):
  text = ("Sure! Here is the environment.\n\n```python\n" + fixture("valid_counter") +
          "```\nIt has a solution() method.")
  v = validate_program(text, pool, CFG)
  assert v.valid and v.class_name == "CounterEnv", v.detail


@pytest.mark.parametrize("text,reason", [
    ("I could not write one.", "no_code"),
    ("```python\nimport os\n" + _BASE + "```", "forbidden"),
    ("```python\nclass BadEnv(:\n```", "syntax"),
])
def test_early_rejections(pool, text, reason):
  v = validate_program(text, pool, CFG)
  assert not v.valid and v.reason == reason


def test_runtime_failures_are_reasons(pool):
  cfg = dataclasses.replace(CFG, skip_static_checks=True)
  v = validate_program(fixture("hostile_sleep"), pool, cfg)
  assert v.reason == "timeout", v.detail
  v = validate_program(fixture("hostile_nan_reward"), pool, cfg)
  assert v.reason in ("contract", "crash"), v.detail
  crash = _BASE.replace("return '', 0.0, True, False, {}", "return int(action)")
  v = validate_program(crash, pool, CFG)
  assert v.reason in ("crash", "contract"), v.detail
  big = _BASE.replace("return '', {}", "return 'x' * 100000, {}")
  v = validate_program(big, pool, CFG)
  assert v.reason == "output_too_large", v.detail


def test_require_solution(pool):
  src = fixture("valid_counter").replace("def solution(self):", "def _solution(self):")
  assert validate_program(src, pool, CFG).valid
  v = validate_program(src, pool, dataclasses.replace(CFG, require_solution=True))
  assert v.reason == "infeasible"


def test_validate_without_pool():
  v = validate_program(builtin_programs()["guess_secret"], None, CFG)
  assert v.valid, v.detail


def test_behaviour_checks_switch_back_to_load_and_reset(pool):
  plain = dataclasses.replace(CFG, behaviour_checks=False)
  for name in ("infeasible", "trivial", "nondeterministic"):
    assert validate_program(fixture(name), pool, plain).valid, name
  assert validate_program("```python\nclass BrokenEnv(:\n  pass\n```", pool,
                          plain).reason == "syntax"


# ---- tool-use contract breaches ------------------------------------------------------

TOOL_CFG = dataclasses.replace(CFG, setting="tool_use", max_turns=8)


def _library_loans(change=None):
  src = builtin_programs("tool_use")["library_loans"]
  if change is None:
    return src
  assert change[0] in src
  return src.replace(*change)


@pytest.mark.parametrize("change,detail", [
    # Two tasks where 3-5 are required.
    ((",\n        (f\"Now lend", ",\n        ] or [(f\"Now lend"), "got list of 2"),
    # Tools that are not a list of named schemas.
    (("self.tools = [", "self.tools = {'name': 'lend'} or ["), "got dict"),
    (("self.tools = [", "self.tools = [{'title': 'lend'}] or ["), "got list of 1"),
])
def test_tool_contract_breaches_are_contract_not_crash(pool, change, detail):
  v = validate_program(_library_loans(change), pool, TOOL_CFG)
  assert v.reason == "contract", (v.reason, v.detail)
  assert detail in v.detail and "Error" not in v.detail and "(at line" not in v.detail, v.detail


def test_a_program_crash_in_tool_reset_is_still_a_crash(pool):
  src = _library_loans(("self.tools = [", "self.tools = 1 / 0 or ["))
  v = validate_program(src, pool, TOOL_CFG)
  assert v.reason == "crash" and "ZeroDivisionError" in v.detail, v.detail


def test_a_contract_outcome_counts_as_a_failed_play():
  from spade_jax.selfplay.episodes import (Episode,  # pylint: disable=import-outside-toplevel
                                           EpisodeSpec)
  ep = Episode(EpisodeSpec(env=0, seed=0), [], [], [])
  for outcome, failed in (("contract", True), ("crash", True), ("solved", False)):
    ep.outcome = outcome
    assert ep.failed == failed, outcome


def test_check_env_says_contract_without_a_traceback(tmp_path):
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  path = tmp_path / "two_tasks.py"
  path.write_text(_library_loans((",\n        (f\"Now lend", ",\n        ] or [(f\"Now lend")))
  repo = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run([sys.executable, "-m", "launch.check_env", str(path)], cwd=repo,
                       capture_output=True, text=True, check=False, timeout=300)
  assert out.returncode == 1, out.stderr[-2000:]
  assert "INVALID (contract)" in out.stdout and "got list of 2" in out.stdout, out.stdout
  assert "Traceback" not in out.stdout + out.stderr
