"""Environment memory: hashing, merging, FIFO, seeded retrieval, elision, crash-safe saving."""

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


def test_defaults_are_the_reference():
  c = MemoryConfig()
  assert (c.capacity, c.eviction, c.band_lo, c.band_hi, c.num_exemplars) == \
      (200, "oldest", 0.15, 0.85, 2)
  assert (c.top_per_exemplar, c.top_min, c.negative_hi, c.negative_lo) == (3, 10, 0.9, 0.1)
  assert c.invalid_negatives  # The one departure, with its switch back.
  assert c.negatives  # One negative per prompt, as the reference shows.
  with pytest.raises(ValueError, match="eviction"):
    MemoryConfig(eviction="random")
  with pytest.raises(ValueError, match="negative_lo"):
    MemoryConfig(negative_lo=0.5, negative_hi=0.4)


def test_fifo_at_capacity_200():
  mem = EnvMemory()
  for i in range(250):
    assert mem.add(rec(program=variant(i), iteration=i)) is not None
  assert len(mem) == 200
  assert [r.code_hash for r in mem] == [code_hash(variant(i)) for i in range(50, 250)]
  # A re-submitted program moves to the back of the queue.
  mem.add(rec(program=variant(50), iteration=250))
  mem.add(rec(program=variant(250), iteration=251))
  assert variant(50) in mem and variant(51) not in mem and len(mem) == 200
  # The other policy: the lowest designer reward goes (the oldest first among ties).
  low = EnvMemory(MemoryConfig(capacity=3, eviction="lowest_reward"))
  for i, reward in enumerate([0.9, 0.1, 0.5, 0.7, 0.5]):
    low.add(rec(program=variant(i), designer_reward=reward, iteration=i))
  assert [r.designer_reward for r in low] == [0.9, 0.7, 0.5]
  assert variant(4) in low and variant(2) not in low


def test_invalid_records_keep_their_own_fifo_and_switch_off():
  mem = EnvMemory(MemoryConfig(capacity=2, invalid_capacity=2))
  for i in range(3):
    mem.add(rec(program=variant(i), iteration=i))
    mem.add(rec(program=variant(10 + i), reason=f"syntax {i}", iteration=i))
  assert [r.reason for r in mem] == [None, "syntax 1", None, "syntax 2"]
  neg = mem.negative("logical deduction", seed=0)
  assert neg.reason in ("syntax 1", "syntax 2")
  # Switched back to the reference: invalid programs are neither stored nor shown.
  ref = MemoryConfig(capacity=2, invalid_negatives=False)
  off = EnvMemory(ref)
  assert off.add(rec(program=variant(20), reason="syntax")) is None and len(off) == 0
  assert off.negative("logical deduction") is None
  loaded = EnvMemory.from_json(mem.to_json(), ref)
  assert len(loaded) == 2 and not any(r.reason for r in loaded)


def test_exemplars_are_in_band_and_of_the_same_skill():
  mem = EnvMemory()
  mem.add(rec(program=variant(1), win_rate_nohint=0.15, regret=0.1))  # Band edges count.
  mem.add(rec(program=variant(2), win_rate_nohint=0.85, regret=-0.2))  # Unfloored regret.
  mem.add(rec(program=variant(3), win_rate_nohint=0.1, regret=0.9))  # Below the band.
  mem.add(rec(program=variant(4), win_rate_nohint=0.9, regret=0.9))  # Above the band.
  mem.add(rec(program=variant(5), skill="optimization", regret=0.9))  # Another skill.
  mem.add(rec(program=variant(6), setting="tool_use", regret=0.9))  # Another setting.
  mem.add(rec(program=variant(7), reason="trivial", regret=0.9))  # Invalid.
  picked = mem.exemplars("logical deduction", setting="games", seed=3)
  assert sorted(r.code_hash for r in picked) == sorted(code_hash(variant(i)) for i in (1, 2))
  assert len(mem.exemplars("logical deduction", seed=3)) == 2  # Any setting: 3 in the pool.
  assert len(mem.exemplars("logical deduction", k=5)) == 3
  assert [r.skill for r in mem.exemplars("optimization")] == ["optimization"]
  assert mem.exemplars("causal inference") == []


def test_exemplars_are_drawn_from_the_top_by_regret():
  mem = EnvMemory()
  for i in range(40):
    mem.add(rec(program=variant(i), regret=i / 100, iteration=i))
  for k, top in ((2, 10), (5, 15)):  # The top max(3k, 10) by regret.
    draws = [tuple(r.regret for r in mem.exemplars("logical deduction", k, seed=s))
             for s in range(40)]
    assert all(len(d) == len(set(d)) == k for d in draws)
    assert {x for d in draws for x in d} == {i / 100 for i in range(40 - top, 40)}
    assert len(set(draws)) > 10  # Different seeds, different exemplars ...
    again = [tuple(r.regret for r in mem.exemplars("logical deduction", k, seed=s))
             for s in range(40)]
    assert again == draws  # ... and the same seed, the same ones.


def test_negative_thresholds():
  mem = EnvMemory()
  for i, win in enumerate([0.95, 0.05, 0.9, 0.1, 0.5]):
    mem.add(rec(program=variant(i), win_rate_nohint=win, win_rate_hint=win, regret=0.0))
  mem.add(rec(program=variant(9), win_rate_nohint=0.99, skill="optimization"))
  reasons = {mem.negative("logical deduction", setting="games", seed=s).reason
             for s in range(30)}
  assert reasons == {"too easy: the agent won 95% of plays without a hint",
                     "too hard: the agent won only 5% of plays without a hint"}
  assert mem.negative("logical deduction", seed=7) == mem.negative("logical deduction", seed=7)
  assert mem.negative("causal inference") is None  # Only the same skill.
  wide = EnvMemory(MemoryConfig(negative_hi=0.85, negative_lo=0.2), records=list(mem))
  wins = {wide.negative("logical deduction", seed=s).win_rate_nohint for s in range(60)}
  assert wins == {0.95, 0.05, 0.9, 0.1}
  off = EnvMemory(MemoryConfig(no_memory=True), records=list(mem))
  assert off.exemplars("logical deduction") == [] and off.negative("logical deduction") is None
  assert len(off) == len(mem)
  # negatives=False: exemplars as before, never a negative, every record kept.
  quiet = EnvMemory(MemoryConfig(negatives=False), records=list(mem))
  assert all(quiet.negative("logical deduction", seed=s) is None for s in range(10))
  assert quiet.exemplars("logical deduction", seed=3) == mem.exemplars("logical deduction",
                                                                      seed=3)
  assert len(quiet) == len(mem)


def test_version_1_files_load_and_unknown_versions_fail():
  v1 = {"version": 1,
        "config": {"capacity": 50, "negative_capacity": 64, "eviction": "lowest_reward",
                   "band_lo": 0.05, "band_hi": 0.85, "min_regret": 0.0,
                   "trivial_win_rate": 0.95, "num_exemplars": 2, "no_memory": False},
        "records": [rec().to_dict()]}
  mem = EnvMemory.from_json(v1)
  assert mem.config == MemoryConfig(capacity=50, eviction="lowest_reward", band_lo=0.05)
  assert [r.to_dict() for r in mem] == [rec().to_dict()]
  with pytest.raises(ValueError, match="version 99.*reads versions 1 and 2"):
    EnvMemory.from_json(dict(v1, version=99))


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
