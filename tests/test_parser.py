r"""The library's one answer parser (`sandbox.worker.actions`): its readings, that evaluation,
task programs and the sandbox use it, and that no other `\boxed` reader appears anywhere."""

import ast
import importlib.util
import inspect
import pathlib
import subprocess

import pytest

from spade_jax.eval import answers, lenient
from spade_jax.sandbox import EnvPool, SandboxConfig
from spade_jax.sandbox.worker import actions

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ---- readings ---------------------------------------------------------------------------


@pytest.mark.parametrize("text,want", [
    (r"\boxed{42}", "42"),
    (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}"),
    (r"\boxed{\frac{\sqrt{2}}{\{x\}}}", r"\frac{\sqrt{2}}{\{x\}}"),
    (r"\boxed{{1, 2}} and \boxed{ {3} } last", " {3} "),
    (r"first \boxed{1} then \boxed{\text{B}}.", r"\text{B}"),
    (r"unclosed \boxed{\frac{1}{2", r"\frac{1}{2"),
    (r"\boxed{7} then unclosed \boxed{8", "8"),
    (r"\boxed{}", ""),
    (r"no box }{ here", None),
    (r"\boxed 5", None),
])
def test_last_boxed_balances_nested_braces(text, want):
  assert actions.last_boxed(text) == want


@pytest.mark.parametrize("text,want", [
    (r"<think>\boxed{1}</think> so \boxed{2}", ("2", "boxed")),
    (r"<think>maybe \boxed{1}</think> the answer is 3", (None, "none")),
    (r"<think>a</think><think>b \boxed{1}</think>\boxed{ {x} }", ("{x}", "boxed")),
    (r"<think>cut inside its thinking \boxed{1}", (None, "none")),
    (r"before <think>thinking", (None, "none")),
    (r"<answer> 7 </answer>", ("7", "tag")),
    (r"<answer>1</answer> <answer>2</answer>", ("2", "tag")),
    (r"<answer>1</answer> \boxed{3}", ("3", "boxed")),
    (r"<think><answer>1</answer></think><answer>2", (None, "none")),
    (r"<answer>unclosed", (None, "none")),
])
def test_final_answer_reads_after_thinking_boxed_then_answer_tag(text, want):
  assert actions.final_answer(text) == want


def test_lenient_and_strict_readings():
  assert actions.lenient_answer("so the answer is 1,024.") == ("1,024", "phrase")
  assert actions.lenient_answer(r"x = \frac{1}{2} = 0.5") == ("0.5", "equals")
  assert actions.strict_answer("the answer is 4") is None
  assert actions.score(r"</think>\boxed{ 12.0 }", "12") == {
      "lenient": True, "strict": True, "answer": "12.0", "how": "boxed"}


@pytest.mark.parametrize("mode,text,want", [
    ("boxed", r"I move \boxed{ {L} } now", "{L}"),
    ("boxed", "  no box  ", "no box"),
    ("boxed", r"<think>\boxed{x}</think>", "x"),  # actions see the whole turn
    ("raw", r" \boxed{1} ", r" \boxed{1} "),
    ("tool_call", '<think><tool_call>{"a": 1}</tool_call></think>'
                  '<tool_call> {"b": 2} </tool_call><tool_call>{"c"', '{"b": 2}'),
    ("tool_call", " plain ", "plain"),
])
def test_program_action_per_mode(mode, text, want):
  assert actions.program_action(text, mode) == want


# ---- one parser everywhere ----------------------------------------------------------------


def test_eval_uses_the_same_function_objects():
  assert answers.last_boxed is actions.last_boxed is lenient.last_boxed
  assert answers.final_answer is actions.final_answer is lenient.final_answer
  assert answers.strip_thinking is actions.visible_text is lenient.visible_text
  assert answers.answer_tag is actions.answer_tag
  for name in lenient.__all__:
    assert getattr(lenient, name) is getattr(actions, name), name


def test_task_programs_embed_the_parser_and_score_alike():
  from spade_jax.selfplay import rlve  # pylint: disable=import-outside-toplevel
  assert answers.scoring_source() == inspect.getsource(actions)
  source = rlve.task_program({"family": "gcd", "level": 0, "seed": 0, "question": "q?",
                              "answer": "1/2"}, scoring="lenient")
  assert answers.scoring_source() in source
  ns = {}
  exec(compile(source, "<task>", "exec"), ns)  # pylint: disable=exec-used
  env = ns["TaskEnv"]()
  for text in (r"\boxed{1/2}", r"<think>\boxed{1/2}</think>\boxed{2}", "<answer>1/2</answer>",
               r"\boxed{\frac{1}{2}}", "answer is 1/2", r"\boxed{1/2"):
    env.reset()
    reward = env.step(text)[1]
    assert reward == float(actions.score(text, "1/2")["lenient"]), text


def test_the_parser_stands_alone():
  # Task programs embed it and the TRL peer benchmark loads it from its file: `re` only.
  path = ROOT / "spade_jax/sandbox/worker/actions.py"
  imports = {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
             for a in n.names}
  assert imports == {"re"} and not any(isinstance(n, ast.ImportFrom)
                                       for n in ast.walk(ast.parse(path.read_text())))
  spec = importlib.util.spec_from_file_location("standalone_actions", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.score(r"\boxed{ 3 }", "3")["strict"] and module.last_boxed("x") is None


PROGRAM = '''
class EchoEnv:
  def reset(self, seed=None, options=None):
    return "go", {}

  def step(self, action):
    return action, 0.0, False, False, {}
'''


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
def test_the_worker_reads_actions_with_the_same_parser(fork_server):
  texts = [r"\boxed{\frac{\sqrt{2}}{2}} or \boxed{ {3} }", r"open \boxed{x{y",
           r"<think>\boxed{1}</think>none", "  plain  "]
  cfg = SandboxConfig(num_workers=0, self_test=False, fork_server=fork_server)
  with EnvPool(cfg) as pool:
    for mode in ("boxed", "raw", "tool_call"):
      hs = pool.start([PROGRAM] * len(texts), action_mode=mode)
      assert all(h.alive for h in hs), [h.detail for h in hs]
      assert all(r.ok for r in pool.reset_many(hs))
      got = [r.value[0] for r in pool.step_many(hs, texts)]
      assert got == [actions.program_action(t, mode) for t in texts], mode
      pool.release(hs)


# ---- no other reader ----------------------------------------------------------------------

# Files that may read `\boxed` themselves, each with its reason.
ALLOWED = {
    # The parser itself.
    "spade_jax/sandbox/worker/actions.py": "the one parser",
    # An env program in the reference's style, which parses its own actions (the sandbox
    # hands such programs the raw turn).
    "tests/fixtures/programs/reference_style.py": "env program parsing its own action",
}
# Env program texts under envs/programs that parse their own actions:
# none today; a new one must be named here.
ALLOWED_PROGRAMS: dict[str, str] = {}

# Calls that read a marker out of a text: str methods and `re` functions.
_READ_CALLS = frozenset({"find", "rfind", "index", "rindex", "split", "rsplit", "partition",
                         "rpartition", "search", "match", "fullmatch", "findall", "finditer",
                         "compile", "sub", "subn"})


def _boxed_readers(source: str) -> list[int]:
  """Lines of calls that search a text for a string mentioning "boxed" (directly or through
  a name bound to such a string)."""
  tree = ast.parse(source)

  def mentions(node, names):
    for sub in ast.walk(node):
      if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "boxed" in sub.value:
        return True
      if isinstance(sub, ast.Name) and sub.id in names:
        return True
    return False

  names: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and mentions(node.value, set()):
      names.update(t.id for t in node.targets if isinstance(t, ast.Name))
  lines = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      f = node.func
      name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
      if name in _READ_CALLS and any(mentions(a, names) for a in node.args):
        lines.append(node.lineno)
  return lines


def test_the_reader_scan_finds_readers():
  assert _boxed_readers('t.rfind("\\\\boxed{")') == [1]
  assert _boxed_readers('import re\nre.findall(r"\\\\boxed\\{(.*)\\}", t)') == [2]
  assert _boxed_readers('B = "\\\\boxed{"\ni = t.find(B)') == [2]
  assert _boxed_readers('x = t.split("\\\\boxed{", 1)[1]') == [1]
  assert not _boxed_readers('ok = "\\\\boxed" in t\nprint("answer in \\\\boxed{}")')


def test_no_other_boxed_reader_in_the_repository():
  files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
  assert "spade_jax/sandbox/worker/actions.py" in files
  found = {}
  for path in files:
    if not (ROOT / path).is_file():
      continue
    lines = _boxed_readers((ROOT / path).read_text(encoding="utf-8"))
    if lines and path not in ALLOWED and path not in ALLOWED_PROGRAMS:
      found[path] = lines
  assert not found, (f"\\boxed readers outside sandbox/worker/actions.py: {found}; use "
                     "actions.last_boxed (or eval.answers) instead")
  for path in ALLOWED_PROGRAMS:
    assert path.startswith("spade_jax/envs/programs/"), path
  for path in list(ALLOWED) + list(ALLOWED_PROGRAMS):
    assert path in files and _boxed_readers((ROOT / path).read_text(encoding="utf-8")), (
        f"{path} no longer reads \\boxed itself: drop it from the allow-list")
