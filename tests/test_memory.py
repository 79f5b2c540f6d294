"""Environment memory: hashing, merging, retrieval, elision and crash-safe saving."""

import ast
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from spade_jax.designer import memory as memory_lib
from spade_jax.designer.memory import EnvMemory, MemoryConfig, MemoryRecord, code_hash
from spade_jax.designer.memory import render_program

PROGRAM = textwrap.dedent('''\
    import random


    class GuessEnv:
      """Guess a hidden number."""

      def __init__(self, max_turns: int = 25, **kwargs):
        self.max_turns = max_turns

      def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, 100)  # hidden
        self.turns = 0
        return "Guess a number from 1 to 100.", {}

      def _feedback(self, guess):
        """Higher or lower."""
        if guess < self.target:
          return "higher"
        if guess > self.target:
          return "lower"
        return "correct"

      def step(self, action):
        self.turns += 1
        try:
          guess = int(action)
        except ValueError:
          return "Send an integer.", 0.0, False, self.turns >= self.max_turns, {}
        fb = self._feedback(guess)
        done = fb == "correct"
        return fb, float(done), done, self.turns >= self.max_turns and not done, {}

      def solution(self):
        return [str(self.target)]
    ''')


def rec(program=PROGRAM, **kw):
  base = dict(doc_id="d", skill="logical deduction", win_rate_nohint=0.3, win_rate_hint=0.6,
              regret=0.3, designer_reward=0.5, iteration=1)
  base.update(kw)
  return MemoryRecord(program=program, **base)


def variant(i):
  return PROGRAM.replace("randint(1, 100)", f"randint(1, {100 + i})")


def test_code_hash_ignores_comments_docstrings_and_formatting():
  reformatted = PROGRAM.replace("  # hidden", "").replace('"""Guess a hidden number."""', "")
  reformatted = reformatted.replace("randint(1, 100)", "randint( 1,100 )")
  reformatted = reformatted.replace('"""Higher or lower."""', "# explains itself")
  assert code_hash(reformatted) == code_hash(PROGRAM)
  assert code_hash(variant(1)) != code_hash(PROGRAM)
  assert code_hash("def broken(:\n  pass  # x") == code_hash("def broken(:\n    pass")


def test_duplicates_merge_statistics():
  mem = EnvMemory()
  mem.add(rec(win_rate_nohint=0.2, regret=0.4, iteration=1))
  merged = mem.add(rec(program=PROGRAM.replace("  # hidden", ""), win_rate_nohint=0.4,
                       regret=0.2, iteration=3, reason=None))
  assert len(mem) == 1
  assert merged.count == 2 and merged.iteration == 3
  assert merged.win_rate_nohint == pytest.approx(0.3)
  assert merged.regret == pytest.approx(0.3)
  assert "# hidden" in merged.program  # First stored text is kept.


def test_save_load_round_trip(tmp_path):
  mem = EnvMemory(MemoryConfig(capacity=10))
  mem.add(rec())
  mem.add(rec(program=variant(1), reason="nondeterministic: transcripts differ"))
  mem.add(rec(program=variant(2), skill="causal inference", regret=0.1))
  path = str(tmp_path / "sub" / "memory.json")
  mem.save(path)
  loaded = EnvMemory.load(path)
  assert loaded.config == mem.config
  assert [r.to_dict() for r in loaded] == [r.to_dict() for r in mem]
  assert os.listdir(tmp_path / "sub") == ["memory.json"]


def test_failed_replace_keeps_previous_file(tmp_path, monkeypatch):
  path = str(tmp_path / "memory.json")
  old = EnvMemory()
  old.add(rec())
  old.save(path)
  new = EnvMemory()
  for i in range(5):
    new.add(rec(program=variant(i)))

  def boom(src, dst):
    raise OSError("disk full")

  monkeypatch.setattr(memory_lib.os, "replace", boom)
  with pytest.raises(OSError, match="disk full"):
    new.save(path)
  monkeypatch.undo()
  assert len(EnvMemory.load(path)) == 1
  assert os.listdir(tmp_path) == ["memory.json"]  # Temporary file cleaned up.


_WRITER = textwrap.dedent('''\
    import json
    import sys
    import time
    from spade_jax.designer.memory import EnvMemory, MemoryRecord

    def half_then_hang(obj, f):  # Writes half the JSON, then stalls until killed.
      text = json.dumps(obj)
      f.write(text[:len(text) // 2])
      f.flush()
      print("half", flush=True)
      time.sleep(60)

    json.dump = half_then_hang
    mem = EnvMemory()
    for i in range(20):
      mem.add(MemoryRecord(program=f"class E{i}Env:\\n  DATA = {'x' * 10_000!r}\\n"))
    mem.save(sys.argv[1])
    ''')


def test_sigkill_during_save_leaves_previous_file(tmp_path):
  path = str(tmp_path / "memory.json")
  old = EnvMemory()
  old.add(rec())
  old.save(path)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=repo)
  proc = subprocess.Popen([sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE,
                          env=env, cwd=repo)
  try:
    assert proc.stdout.readline().strip() == b"half"
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait(timeout=30)
  assert proc.returncode == -signal.SIGKILL
  partial = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
  assert len(partial) == 1  # The interrupted write, never renamed over the real file.
  loaded = EnvMemory.load(path)
  assert [r.to_dict() for r in loaded] == [r.to_dict() for r in old]


def test_capacity_eviction_and_negative_quota():
  mem = EnvMemory(MemoryConfig(capacity=3, negative_capacity=1))
  for i, reward in enumerate([0.9, 0.1, 0.5, 0.7]):
    mem.add(rec(program=variant(i), designer_reward=reward, iteration=i))
  assert sorted(r.designer_reward for r in mem) == [0.5, 0.7, 0.9]  # Lowest dropped.
  mem.add(rec(program=variant(10), reason="syntax error", iteration=5))
  mem.add(rec(program=variant(11), reason="api: step returned 4 values", iteration=6))
  negatives = [r for r in mem if r.reason]
  assert len(negatives) == 1 and negatives[0].iteration == 6  # Oldest negative dropped.
  assert len(mem) == 3
  fifo = EnvMemory(MemoryConfig(capacity=2, eviction="oldest"))
  for i in range(4):
    fifo.add(rec(program=variant(i), iteration=i, designer_reward=-i))
  assert sorted(r.iteration for r in fifo) == [2, 3]
  with pytest.raises(ValueError, match="eviction"):
    MemoryConfig(eviction="random")


def test_retrieval_band_order_negatives_and_ablation():
  mem = EnvMemory(MemoryConfig(band_lo=0.1, band_hi=0.8, num_exemplars=2))
  mem.add(rec(program=variant(1), regret=0.2, win_rate_nohint=0.5))
  mem.add(rec(program=variant(2), regret=0.6, win_rate_nohint=0.3))
  mem.add(rec(program=variant(3), regret=0.03, win_rate_nohint=0.97, win_rate_hint=1.0))
  mem.add(rec(program=variant(4), regret=0.4, win_rate_nohint=0.5, skill="optimization"))
  mem.add(rec(program=variant(5), reason="infeasible: solution() replay ends with reward 0"))
  ex = mem.exemplars(skill="logical deduction")
  assert [r.regret for r in ex] == [0.6, 0.2]  # Same skill first, by regret.
  ex = mem.exemplars(skill="optimization", k=3)
  assert [r.regret for r in ex] == [0.4, 0.6, 0.2]
  huge = rec(program=PROGRAM + "".join(f"\nX{i} = {i}" for i in range(400)), regret=0.7)
  mem.add(huge)
  assert mem.exemplars(skill="logical deduction")[0].code_hash == huge.code_hash
  fitting = mem.exemplars(skill="logical deduction", max_chars=1_500)
  assert [r.regret for r in fitting] == [0.6, 0.2]  # The long one cannot fit; skipped.
  neg = mem.negative(skill="logical deduction")
  reasons = {mem.negative(seed=s).reason for s in range(2)}
  assert neg is not None and neg.reason
  assert reasons == {"infeasible: solution() replay ends with reward 0",
                     "too easy: the agent solved 97% of episodes without any hint"}
  off = EnvMemory(MemoryConfig(no_memory=True), records=list(mem))
  assert off.exemplars() == [] and off.negative() is None and len(off) == len(mem)


def test_render_program_never_cuts_mid_class():
  full = render_program(PROGRAM, 10_000)
  assert full == PROGRAM.rstrip()
  sizes = []
  for budget in (900, 700, 500, 400):
    out = render_program(PROGRAM, budget)
    if out is None:
      continue
    tree = ast.parse(out)  # Always complete, parseable code.
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert cls and cls[0].name == "GuessEnv"
    names = [n.name for n in cls[0].body if isinstance(n, ast.FunctionDef)]
    assert names == ["__init__", "reset", "_feedback", "step", "solution"]
    assert len(out) <= budget
    sizes.append(len(out))
  assert sizes and "..." in render_program(PROGRAM, 500)
  assert render_program(PROGRAM, 50) is None
  assert render_program("class Broken(:\n" * 20, 30) is None
