"""The mechanism experiment: warm-start data, the smoke build, one arm's smoke run, report."""

import dataclasses
import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from experiments.mechanism import common, config, data, report
from spade_jax import envs
from spade_jax.envs.families import FAMILIES, HELD_OUT
from spade_jax.models import ByteVocab, ChatTemplate


@pytest.fixture(scope="module")
def chat():
  return ChatTemplate(ByteVocab(), thinking=False)


@pytest.fixture(scope="module")
def pool():
  from spade_jax import sandbox
  with sandbox.EnvPool(sandbox.SandboxConfig()) as p:
    yield p


def test_designer_rows_train_only_a_valid_family_program(chat, tmp_path, pool):
  rows = data.designer_examples(chat, data.corpus(str(tmp_path), seed=0), 4, seed=0,
                                families=common.seen(), budget=None)
  assert {r.meta["skill"] for r in rows} <= set(common.skills())
  assert all(r.meta["family"] != HELD_OUT for r in rows)
  for r in rows:
    target = [t for t, m in zip(r.tokens, r.mask) if m]
    assert target[-1] == chat.vocab.eos_id
    prompt_end = r.mask.index(True)
    assert not any(r.mask[:prompt_end]) and all(r.mask[prompt_end:])
    text = chat.vocab.decode(target[:-1])
    fam = FAMILIES[r.meta["family"]]
    assert envs.extract_program(text) == fam.program(**r.meta["knobs"]).rstrip()
  verdicts = envs.validate_many([chat.vocab.decode(r.tokens[r.mask.index(True):])
                                 for r in rows[:2]], pool,
                                envs.ValidationConfig(max_turns=common.MAX_TURNS))
  assert all(v.valid for v in verdicts), [v.reason for v in verdicts]
  # per skill, a skill's families share its rows; per family, each family has its share
  import collections
  kw = dict(families=common.seen(), budget=None)
  corpus = data.corpus(str(tmp_path), seed=0)
  by_skill = collections.Counter(r.meta["skill"] for r in data.designer_examples(
      chat, corpus, 40, seed=0, **kw))
  assert set(by_skill.values()) == {40 // len(common.skills())}
  by_family = collections.Counter((r.meta["family"], r.meta["skill"]) for r in
                                  data.designer_examples(chat, corpus, 40, seed=0,
                                                         balance="family", **kw))
  assert set(by_family.values()) == {40 // len(common.seen())}
  assert all(FAMILIES[f].skill == s for f, s in by_family)
  with pytest.raises(ValueError, match="expected one of"):
    data.designer_examples(chat, corpus, 1, seed=0, balance="skills", **kw)


def test_agent_rows_are_the_self_play_conversation(chat, pool):
  rows = data.agent_examples(pool, chat, 6, seed=3, families=("guess_number",), levels=(0,),
                             p=0.0, p_hinted=0.0, hinted_frac=0.5,
                             max_turns=common.MAX_TURNS)
  assert len(rows) == 6 and all(r.meta["solved"] for r in rows)  # no slips: every play wins
  for r in rows:
    text = chat.vocab.decode(r.tokens)
    assert text.startswith("<|im_start|>system\n")
    assert ("Hint:" in text) == bool(r.meta["hinted"])
    trained = [t for t, m in zip(r.tokens, r.mask) if m]
    turns = trained.count(chat.vocab.eos_id)  # each trained turn ends at the turn end
    acts = "".join(chat.vocab.decode(trained[i:i + 1]) for i in range(len(trained)))
    assert acts.count("\\boxed{") == turns >= 1
    # Only the agent's turns are trained: the environment's text never is.
    assert "too low" not in acts and "too high" not in acts


def test_slips_lower_the_scripted_win_rate(chat, pool):
  kw = dict(families=("arithmetic_chain",), levels=(4,), hinted_frac=0.0,
            max_turns=common.MAX_TURNS)
  clean = data.agent_examples(pool, chat, 12, seed=1, p=0.0, p_hinted=0.0, **kw)
  noisy = data.agent_examples(pool, chat, 12, seed=1, p=0.5, p_hinted=0.5, **kw)
  win = lambda rows: sum(r.meta["solved"] for r in rows) / len(rows)
  assert win(clean) == 1.0 and win(noisy) < 0.5


def test_worked_transcripts_add_the_step_and_keep_the_play(chat, pool):
  """``worked=True`` writes the family's worked step before each box that follows the
  plan; the same seed plays the same episodes, slips and outcomes, and every turn fits
  the run's ``AGENT_TURN_TOKENS`` (bytes bound BPE tokens)."""
  kw = dict(families=common.seen(), levels=range(5), p=0.15, p_hinted=0.05,
            hinted_frac=0.5, max_turns=common.MAX_TURNS)
  bare = data.agent_examples(pool, chat, 30, seed=5, **kw)
  worked = data.agent_examples(pool, chat, 30, seed=5, worked=True, **kw)

  def turns(row):
    trained = [t for t, m in zip(row.tokens, row.mask) if m]
    out, cur = [], []
    for t in trained:
      cur.append(t)
      if t == chat.vocab.eos_id:
        out.append(chat.vocab.decode(cur[:-1]))
        assert len(cur) <= common.AGENT_TURN_TOKENS, chat.vocab.decode(cur)
        cur = []
    return out

  with_work = 0
  for b, w in zip(bare, worked):
    assert (b.meta["family"], b.meta["knobs"], b.meta["solved"]) == (
        w.meta["family"], w.meta["knobs"], w.meta["solved"])
    tb, tw = turns(b), turns(w)
    assert len(tb) == len(tw) >= 1
    for x, y in zip(tb, tw):
      assert y.endswith(x) and x.startswith("\\boxed{")  # the same action, boxed last
      if y != x:
        with_work += 1
        assert y[:-len(x)].strip() and FAMILIES[w.meta["family"]].work
  assert with_work >= 10


def chat_of(build_dir):
  """The vocabulary of a warm-start build."""
  from spade_jax.models.tokenizer import load_tokenizer
  return load_tokenizer(os.path.join(build_dir, "tokenizer"))


def test_copy_rows_train_only_the_repeat():
  vocab = ByteVocab()
  rows = data.copy_examples(vocab, 6, seed=2)
  assert rows == data.copy_examples(vocab, 6, seed=2)  # seeded
  for i, r in enumerate(rows):
    k = r.mask.index(True)
    assert not any(r.mask[:k]) and all(r.mask[k:]) and r.tokens[-1] == vocab.eos_id
    first, again = vocab.decode(r.tokens[:k]), vocab.decode(r.tokens[k:-1])
    assert first == again + "\n" and 8 <= len(again.split()) <= 60
    assert again.replace(" ", "").isdigit() == (i % 2 == 0)


def test_arithmetic_drill_rows_are_right_and_train_only_results():
  vocab = ByteVocab()
  rows = data.arithmetic_examples(vocab, 40, seed=1, lines=16)
  assert rows == data.arithmetic_examples(vocab, 40, seed=1, lines=16)  # seeded
  signs, negative = set(), 0
  for r in rows:
    assert r.tokens[-1] == vocab.eos_id and r.mask[-1]
    text = vocab.decode(r.tokens[:-1])
    trained = "".join(vocab.decode([t]) for t, m in zip(r.tokens[:-1], r.mask) if m)
    lines = text.splitlines()
    assert len(lines) == 16
    results = []
    for line in lines:
      left, result = line.split(" = ")
      a, sign, b = left.split(" ")
      signs.add(sign)
      want = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[sign]
      assert int(result) == want, line
      assert (2 <= int(b) <= 3) if sign == "*" else (2 <= int(b) <= 50)
      negative += int(result) < 0
      results.append(" " + result + "\n")
    assert trained == "".join(results)  # the results alone are trained
  assert signs == {"+", "-", "*"} and negative > 0


def test_equation_drill_rows_come_from_every_worked_familys_steps(chat, pool):
  """``equation_examples``: every line is a right ``a op b = c`` ("/" floors), its operands
  are ones the worked steps hold for that operator, only the results are trained, and the
  lines cover the operators of every family whose worked steps hold equations."""
  from experiments.mechanism import warm_start
  kw = dict(families=common.seen(), levels=range(5), p=0.15, p_hinted=0.05,
            hinted_frac=0.5, max_turns=common.MAX_TURNS)
  rows = data.agent_examples(pool, chat, 60, seed=3, worked=True, **kw)
  eqs = data.equations(rows)
  fams = {f for f, _ in eqs}
  assert {"arithmetic_chain", "prime_factors", "guess_number"} <= fams, fams
  assert "grid_path" not in fams and "pet_owners" not in fams  # no equations in their steps
  vocab = chat.vocab
  drill = data.equation_examples(vocab, rows, 30, seed=1, lines=12)
  assert drill == data.equation_examples(vocab, rows, 30, seed=1, lines=12)  # seeded
  ops = set()
  for r in drill:
    assert r.tokens[-1] == vocab.eos_id and r.mask[-1] and r.role == data.AGENT
    text = vocab.decode(r.tokens[:-1])
    trained = "".join(vocab.decode([t]) for t, m in zip(r.tokens[:-1], r.mask) if m)
    results = []
    for line in text.splitlines():
      left, result = line.split(" = ")
      a, op, b = left.split(" ")
      a, b = int(a), int(b)
      want = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None}[op]
      assert int(result) == want, line
      assert any(k[1] == op and a in v[0] for k, v in eqs.items()), line
      assert any(k[1] == op and b in v[1] for k, v in eqs.items()), line
      ops.add(op)
      results.append(" " + result + "\n")
    assert len(results) == 12 and trained == "".join(results)
  assert ops == {"+", "-", "*", "/"}
  # the bare transcripts record no worked step: the build says how to get them
  bare = data.agent_examples(pool, chat, 6, seed=3, **kw)
  with pytest.raises(ValueError, match="--worked"):
    warm_start.drill_examples("OUT", vocab, bare, "equations", 4)
  with pytest.raises(ValueError, match="expected one of"):
    warm_start.drill_examples("OUT", vocab, rows, "algebra", 4)
  assert len(warm_start.drill_examples("OUT", vocab, rows, "equations", 4)) == 4


def test_copy_check_rows_and_a_short_run(tmp_path):
  from experiments.mechanism import copy_check  # pylint: disable=g-import-not-at-top
  fixed = copy_check.examples(5, 0, alphabet=20, fixed_len=30)
  free = copy_check.examples(40, 0, alphabet=20, fixed_len=None)
  for r in fixed + free:
    k = r.tokens.index(copy_check.SEP)
    assert r.tokens[k + 1:-1] == r.tokens[:k] and r.tokens[-1] == copy_check.END
    assert r.mask == [False] * (k + 1) + [True] * (k + 1)
    assert all(copy_check.FIRST_ID <= t < copy_check.FIRST_ID + 20 for t in r.tokens[:k])
  assert {len(r.tokens) for r in fixed} == {62}
  assert len({len(r.tokens) for r in free}) > 10  # no fixed distance to copy from
  short = copy_check.examples(30, 0, alphabet=20, fixed_len=None, lengths=(3, 5))
  assert {r.tokens.index(copy_check.SEP) for r in short} == {3, 4, 5}
  picked = copy_check.examples(30, 0, alphabet=0, fixed_len=None, lengths=(3, 5),
                               ids=[11, 40, 97])
  assert {t for r in picked for t in r.tokens[:r.tokens.index(copy_check.SEP)]} == {11, 40, 97}
  with pytest.raises(ValueError, match="at least two ids"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=0, learning_rate=1e-3,
                   seq_len=256, fixed_len=0, every=1, ids=[3, 50])
  curve = copy_check.run(size="smoke", offset="variable", steps=4, alphabet=20,
                         learning_rate=3e-3, seq_len=256, fixed_len=0, every=2,
                         qk_scale=2.0, lengths=(8, 40), save=str(tmp_path / "w"),
                         num_layers=1, shape=copy_check.parse_shape("d_model=48, mlp_dim=96"),
                         log=lambda _: None)
  assert [c["step"] for c in curve] == [2, 4]
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  saved_params, saved = models.load_hf(str(tmp_path / "w"))  # what warm_start --init_from reads
  assert (saved.num_layers, saved.d_model, saved.mlp_dim, saved.vocab_size) == (1, 48, 96, 30)
  again = copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20,
                         learning_rate=1e-9, seq_len=256, fixed_len=0, every=1,
                         lengths=(8, 40), num_layers=1, shape={"d_model": 48, "mlp_dim": 96},
                         init_from=str(tmp_path / "w"), save=str(tmp_path / "w2"),
                         log=lambda _: None)
  assert len(again) == 1
  resumed, _ = models.load_hf(str(tmp_path / "w2"))  # started from w, moved by ~1e-9
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(saved_params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  with pytest.raises(ValueError, match="holds a different model"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20, learning_rate=1e-3,
                   seq_len=256, fixed_len=0, every=1, init_from=str(tmp_path / "w"))
  for bad, match in (("d_model", "key=integer"), ("d_model=x", "key=integer")):
    with pytest.raises(ValueError, match=match):
      copy_check.parse_shape(bad)
  for shape in ({"width": 3}, {"vocab_size": 64}):
    with pytest.raises(ValueError, match="cannot be set there"):
      copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20, learning_rate=1e-3,
                     seq_len=256, fixed_len=0, every=1, shape=shape)
  assert all(0.0 <= c["repeat_top1"] <= 1.0 and math.isfinite(c["loss"]) for c in curve)
  pytest.importorskip("transformers")
  curve = copy_check.run(size="smoke", offset="fixed", steps=3, alphabet=20,
                         learning_rate=3e-3, seq_len=124, fixed_len=30, every=1,
                         vs_torch=True, log=lambda _: None)
  for c in curve:  # the same model trained in PyTorch on the same rows
    assert c["torch_loss"] == pytest.approx(c["loss"], rel=1e-5)
  with pytest.raises(ValueError, match="raise --seq_len"):
    copy_check.run(size="smoke", offset="fixed", steps=1, alphabet=20, learning_rate=1e-3,
                   seq_len=64, fixed_len=40, every=1)
  with pytest.raises(ValueError, match="multiple of it"):
    copy_check.run(size="smoke", offset="fixed", steps=1, alphabet=20, learning_rate=1e-3,
                   seq_len=130, fixed_len=30, every=1)
  with pytest.raises(ValueError, match="pass --offset=fixed"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20,
                   learning_rate=1e-3, seq_len=256, fixed_len=30, every=1, vs_torch=True)
  with pytest.raises(ValueError, match="1 <= min_len <= max_len"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20,
                   learning_rate=1e-3, seq_len=256, fixed_len=30, every=1, lengths=(9, 8))
  with pytest.raises(ValueError, match="at least one layer"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20,
                   learning_rate=1e-3, seq_len=256, fixed_len=30, every=1, num_layers=-1)
  with pytest.raises(ValueError, match="must be positive"):
    copy_check.run(size="smoke", offset="variable", steps=1, alphabet=20,
                   learning_rate=1e-3, seq_len=256, fixed_len=30, every=1, qk_scale=0.0)


def test_pack_keeps_every_token_in_its_own_segment():
  ex = [data.Example(list(range(1, n + 1)), [i % 2 == 0 for i in range(n)], i % 2)
        for i, n in enumerate([5, 9, 3, 7, 2, 6])]
  batch = next(data.pack(ex, batch_size=2, seq_len=16, seed=0))
  assert batch["tokens"].shape == (2, 16)
  seen = []
  for r in range(2):
    for s in range(1, batch["segment_ids"][r].max() + 1):
      at = batch["segment_ids"][r] == s
      seen.append(batch["tokens"][r][at].tolist())
      np.testing.assert_array_equal(batch["positions"][r][at], np.arange(at.sum()))
  # Every packed segment is one whole example (with this data, each at most once).
  import collections
  left = collections.Counter(tuple(e.tokens) for e in ex)
  left.subtract(collections.Counter(map(tuple, seen)))
  assert seen and min(left.values()) >= 0
  with pytest.raises(ValueError, match="seq_len"):
    next(data.pack(ex, batch_size=2, seq_len=4, seed=0))


def test_static_pool_holds_every_seen_family_at_every_level(tmp_path, monkeypatch):
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
  rows = [json.loads(l) for l in open(config.static_pool_path())]
  assert len(rows) == 5 * len(common.seen())
  assert not any(r["id"].startswith(HELD_OUT + ":") for r in rows)


def test_arm_configs_differ_only_where_the_arm_says(tmp_path, monkeypatch):
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
  flat = lambda c: {f"{k}.{j}": w for k, v in c.to_dict().items()
                    for j, w in (v.items() if isinstance(v, dict) else [("", v)])}
  base = flat(config.get_config("arm=spade,seed=1"))
  diffs = {arm: {k for k, v in flat(config.get_config(f"arm={arm},seed=1")).items()
                 if base.get(k) != v} for arm in common.ARMS}
  assert diffs == {"spade": set(), "solve_rate": {"rewards.variant"},
                   "frozen_designer": {"selfplay.train_designer"},
                   "static": {"selfplay.env_source", "static_pool.path"}}
  # The same agent-play budget in every arm.
  assert base["selfplay.plays"] * base["selfplay.num_envs"] == 32
  # No arm shows a negative example: a prompt with one shows two programs, over the
  # 1,024-token designer prompt budget; exemplars still show.
  from spade_jax.designer import EnvMemory, MemoryConfig
  assert base["memory.negatives"] is False and base["memory.num_exemplars"] == 1
  mem = EnvMemory(MemoryConfig(**config.get_config("arm=spade").memory.to_dict()))
  assert mem.config.negatives is False  # the config section builds the memory it names
  with pytest.raises(ValueError, match="Unknown arm"):
    config.get_config("arm=nope")


def test_config_warm_start_names_a_build_or_an_hf_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
  hf = tmp_path / "build" / "hf"
  hf.mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="holds no HF checkpoint"):
    config.get_config(f"arm=spade,warm_start={tmp_path / 'build'}")
  (hf / "config.json").write_text("{}")
  for given in (tmp_path / "build", hf):
    assert config.get_config(f"arm=static,warm_start={given}").model.init_from == f"hf:{hf}"
  assert config.get_config("arm=spade").model.init_from == "hf:" + os.path.join(
      common.warm_start_dir(), "hf")


def test_run_all_queues_the_unfinished_runs_seed_by_seed(tmp_path):
  from experiments.mechanism import run
  done = {"arm": "spade", "seed": 0, "iterations": config.ITERATIONS, "series": {}}
  (tmp_path / "spade-0.json").write_text(json.dumps(done))
  (tmp_path / "static-0.json").write_text(json.dumps(dict(done, arm="static",
                                                          iterations=3)))  # interrupted
  calls = []
  run.run_all(results=str(tmp_path), start="/ws",
              runner=lambda arm, seed, **kw: calls.append((arm, seed, kw["start"])))
  assert calls[:3] == [("static", 0, "/ws"), ("solve_rate", 0, "/ws"),
                       ("frozen_designer", 0, "/ws")]
  assert len(calls) == len(common.ARMS) * len(common.SEEDS) - 1
  assert [c[1] for c in calls] == sorted(c[1] for c in calls)  # seed by seed


def test_staged_recipe_arguments():
  from experiments.mechanism import warm_start
  names = [n for n, _ in warm_start.STAGES]
  assert names == ["worked", "drill", "designer", "families"]
  full = [warm_start.stage_build(kw) for _, kw in warm_start.STAGES]
  # Only the first stage trains stage 0; the last plays every seen family, balanced.
  assert [k["induction_steps"] for k in full] == [400, 0, 0, 0]
  assert full[-1]["families"] == "" and full[-1]["designer_balance"] == "family"
  assert full[-1]["drill"] == "equations" and all(k["num_microbatches"] == 1 for k in full)
  small = warm_start.stage_build(warm_start.STAGES[0][1], smoke=True)
  assert small["steps"] == 2 and small["induction_steps"] == 2 and small["agent_rows"] == 8
  assert small["families"] == "arithmetic_chain" and small["designer_rows"] == 0
  with pytest.raises(ValueError, match="not build arguments"):
    warm_start.stage_build(dict(step=3))
  with pytest.raises(ValueError, match="at least one stage"):
    warm_start.build_staged("/nonexistent", stages=())


def test_staged_smoke_build_chains_weights_and_tokenizer(tmp_path):
  """The default warm-start command at smoke size: every stage of STAGES, each from the
  last one's checkpoint, its tokenizer carried over; the last one's is the warm start."""
  from experiments.mechanism import warm_start
  from spade_jax import models
  out, store = str(tmp_path / "ws"), str(tmp_path / "store")
  levels = warm_start.build_staged(out, smoke=True, store=store)
  dirs = warm_start.stage_dirs(out)
  assert [os.path.basename(d) for d in dirs] == [
      f"{i}_{n}" for i, (n, _) in enumerate(warm_start.STAGES)]
  tok = [open(os.path.join(d, "tokenizer", "tokenizer.json")).read() for d in dirs]
  assert all(t == tok[0] for t in tok)  # adopted from the stage before, never retrained
  assert os.path.isfile(os.path.join(dirs[0], "induction", "config.json"))
  assert json.load(open(os.path.join(dirs[-1], "data_stats.json")))["families"] == sorted(
      common.seen())
  last, _ = models.load_hf(os.path.join(dirs[-1], "hf"))
  got, _ = models.load_hf(os.path.join(out, "hf"))
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(last), jax.tree.leaves(got)))
  assert json.load(open(os.path.join(out, "levels.json"))) == levels
  assert "designer" in levels  # the last stage measures the designer
  rec = json.load(open(warm_start.write_staged_results(out, levels, str(tmp_path / "r.json"))))
  assert [s["name"] for s in rec["stages"]] == [n for n, _ in warm_start.STAGES]
  assert all(s["loss"] and s["levels"] for s in rec["stages"]) and rec["levels"] == levels
  assert rec["stages"][0]["build"]["steps"] == 600  # the recipe's, not the smoke's
  # A look midway: a stage's checkpoint exported beside it, as the build would export it.
  snap = warm_start.snapshot(dirs[-1], smoke=True)
  assert snap == os.path.join(dirs[-1], "hf_2")  # the smoke stages run 2 steps
  got, _ = models.load_hf(snap)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(last), jax.tree.leaves(got)))
  assert os.path.isfile(os.path.join(snap, "tokenizer.json"))
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    warm_start.snapshot(str(tmp_path / "empty"), smoke=True)
  # A rerun finds every stage done and changes nothing.
  assert warm_start.build_staged(out, smoke=True, store=store) == levels
  # Every stage was stored; another checkout's build takes them all and trains nothing.
  stored = warm_start.store_dirs(store)
  meta = [json.load(open(os.path.join(d, "stage.json"))) for d in stored]
  assert [m["name"] for m in meta] == [n for n, _ in warm_start.STAGES]
  assert all(m["finished"] and m["step"] == 2 for m in meta)
  assert [m["sha256"] for m in meta] == [common.weights_digest(os.path.join(d, "hf"))
                                         for d in dirs]
  assert warm_start.publish_staged(out, store, smoke=True) == stored  # already there
  fresh = str(tmp_path / "fresh")
  assert warm_start.build_staged(fresh, smoke=True, store=store) == levels
  assert common.weights_digest(os.path.join(fresh, "hf")) == meta[-1]["sha256"]
  assert not any(os.path.exists(os.path.join(d, "train"))
                 for d in warm_start.stage_dirs(fresh))
  assert json.load(open(os.path.join(warm_start.stage_dirs(fresh)[0], "levels.json"))) == (
      json.load(open(os.path.join(dirs[0], "levels.json"))))
  # Half a build stored: a checkout goes on from the first stage missing.
  half = str(tmp_path / "half")
  assert warm_start.publish_staged(out, half, smoke=True, stages=warm_start.STAGES[:2]) == (
      warm_start.store_dirs(half)[:2])
  with pytest.raises(ValueError, match="other weights"):  # not what others start from
    warm_start.publish_stage(dirs[0], stored[1], "drill",
                             warm_start.stage_build(warm_start.STAGES[0][1], smoke=True))
  with pytest.raises(FileNotFoundError, match="nothing to store"):
    warm_start.publish_stage(str(tmp_path / "empty"), str(tmp_path / "s"), "worked", {})
  # A stored stage the recipe no longer builds, or a damaged copy, is refused.
  m0 = os.path.join(stored[1], "stage.json")
  json.dump(dict(meta[1], build=dict(meta[1]["build"], steps=99)), open(m0, "w"))
  with pytest.raises(ValueError, match=r"other arguments.*\['steps'\]"):
    warm_start.build_staged(str(tmp_path / "stale"), smoke=True, store=store)
  json.dump(meta[1], open(m0, "w"))
  weights = [n for n in os.listdir(os.path.join(stored[1], "hf")) if n.endswith(".safetensors")]
  with open(os.path.join(stored[1], "hf", weights[0]), "r+b") as f:
    f.seek(-4, 2)
    f.write(b"\0\1\2\3")
  with pytest.raises(ValueError, match="damaged"):
    warm_start.build_staged(str(tmp_path / "bad_copy"), smoke=True, store=store)
  # A build whose tokenizer differs from its --init_from's refuses to start.
  other = tmp_path / "other"
  (other / "tokenizer").mkdir(parents=True)
  (other / "tokenizer" / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="different tokenizer"):
    warm_start.adopt_tokenizer(str(other), os.path.join(out, "hf"))
  with pytest.raises(ValueError, match="only the first stage"):
    warm_start.build_staged(str(tmp_path / "bad"), smoke=True, stages=(
        warm_start.STAGES[1], warm_start.STAGES[0]))


def test_stored_unfinished_stage_goes_on_from_its_step(tmp_path):
  """A stage stopped midway is stored as its latest checkpoint's weights and step; another
  checkout's build takes them, skips stage 0, trains the remaining steps with the schedule
  where it was, and its finished copy replaces the unfinished one."""
  from experiments.mechanism import warm_start
  from spade_jax import models
  kw = warm_start.stage_build(warm_start.STAGES[0][1], smoke=True)  # 2 steps, stage 0 too
  first, store = str(tmp_path / "a"), str(tmp_path / "store")
  warm_start.build(first, smoke=True, **kw)
  # As if a 4-step build had stopped after its step-2 checkpoint.
  kw4 = dict(kw, steps=4)
  shutil.rmtree(os.path.join(first, "hf"))
  os.remove(os.path.join(first, "levels.json"))
  warm_start.publish_stage(first, store, "worked", kw4, smoke=True)
  meta = json.load(open(os.path.join(store, "stage.json")))
  assert (meta["finished"], meta["step"], meta["build"]["steps"]) == (False, 2, 4)
  assert not os.path.exists(os.path.join(first, "hf_2"))  # the export is not left behind
  # A build at the same step stores nothing new; one with other arguments is refused.
  assert warm_start.publish_stage(first, store, "worked", kw4, smoke=True) == store
  with pytest.raises(ValueError, match=r"other arguments.*\['steps'\]"):
    warm_start.seed_stage(str(tmp_path / "x"), store, "worked", kw)
  second = str(tmp_path / "b")
  assert warm_start.seed_stage(second, store, "worked", kw4)
  stored, _ = models.load_hf(os.path.join(second, "stored_hf"))
  assert json.load(open(os.path.join(second, "resume.json")))["step"] == 2
  warm_start.build(second, smoke=True, **kw4)
  assert not os.path.exists(os.path.join(second, "induction"))  # stage 0 not rerun
  steps = [json.loads(l)["step"] for l in open(os.path.join(second, "train_log.jsonl"))]
  assert steps == [2, 4]  # the stored log, then the steps trained here
  done, _ = models.load_hf(os.path.join(second, "hf"))
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(stored),
                                                      jax.tree.leaves(done)))
  warm_start.publish_stage(second, store, "worked", kw4, smoke=True)
  meta = json.load(open(os.path.join(store, "stage.json")))
  assert (meta["finished"], meta["step"]) == (True, 4)
  assert meta["sha256"] == common.weights_digest(os.path.join(second, "hf"))
  # The optimizer state travels in bfloat16: AdamW's moments to within its rounding,
  # its step counts exactly.
  state, _, _ = warm_start._restore(first, True, 2)
  path = str(tmp_path / "opt.npz")
  warm_start.save_opt_state(path, state.opt_state)
  back = warm_start.load_opt_state(path, state.opt_state)
  for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(back)):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype
    np.testing.assert_allclose(b, a, rtol=2 ** -8, atol=0)
  assert any(np.asarray(a).any() for a in jax.tree.leaves(back))  # moments are not zeros
  with pytest.raises(ValueError, match="another optimizer"):
    warm_start.load_opt_state(path, jax.tree.leaves(state.opt_state)[1:])


def test_staged_recipe_refuses_single_build_flags():
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-m", "experiments.mechanism.warm_start", "--steps=5",
                      "--out=/nonexistent"], capture_output=True, text=True, timeout=300,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert r.returncode != 0 and "--recipe=single" in r.stderr + r.stdout


def test_report_table_is_computed_from_the_results(tmp_path):
  def result(arm, seed, held):
    return {"arm": arm, "seed": seed, "iterations": 3, "series": {
        "eval/families/held_out/success": [[2, 0.0], [3, held]],
        "rewards/regret_mean": [[1, 0.0], [2, 0.1 * seed], [3, 0.2 * seed]],
        "rewards/win_rate_band_frac": [[1, 0.5], [2, 0.25], [3, 0.0]],
        "rewards/win_rate_mean": [[1, 0.3], [2, 0.6], [3, 0.3]],
        "designer/valid_rate": [[1, 1.0]]}}
  for arm, held in (("spade", (0.2, 0.4, 0.6)), ("static", (0.1, 0.1, 0.1))):
    for seed, h in enumerate(held):
      with open(tmp_path / f"{arm}-{seed}.json", "w") as f:
        json.dump(result(arm, seed, h), f)
  # Other records in the results folder are not runs.
  for name in ("warm_start", "agent_only", "diagnose", "spade-0-smoke", "summary"):
    (tmp_path / f"{name}.json").write_text(json.dumps({"build": {}, "levels": {}}))
  (tmp_path / "README.md").write_text("x\n<!-- table -->\nold\n<!-- /table -->\n"
                                      "<!-- runs -->\n<!-- /runs -->\ny\n")
  assert len(report.load(str(tmp_path))) == 6
  s = report.report(str(tmp_path), readme=str(tmp_path / "README.md"))
  # mean 0.4, sd 0.2, t(2) = 4.303: half-width 4.303 * 0.2 / sqrt(3)
  assert s["spade"]["held_out"]["mean"] == pytest.approx(0.4)
  assert s["spade"]["held_out"]["ci95"] == pytest.approx(4.303 * 0.2 / math.sqrt(3))
  assert s["static"]["held_out"]["ci95"] == pytest.approx(0.0, abs=1e-12)
  # regret slopes 0, 0.1, 0.2 per iteration -> per 10 iterations 0, 1, 2 -> mean 1
  assert s["spade"]["regret_trend"]["mean"] == pytest.approx(1.0)
  assert s["spade"]["band_share"]["mean"] == pytest.approx(0.25)
  # spade minus static, per column: held-out 0.4 - 0.1, pooled variance (0.08 + 0) / 4
  # over 1/3 + 1/3, t(4) = 2.776; equal band shares differ by 0 with no spread.
  c = s["contrasts"]["static"]
  assert c["held_out"]["diff"] == pytest.approx(0.3) and c["held_out"]["df"] == 4
  assert c["held_out"]["ci95"] == pytest.approx(2.776 * math.sqrt(0.02 * 2 / 3))
  assert c["band_share"]["diff"] == pytest.approx(0.0) and c["valid_rate"]["df"] == 4
  readme = (tmp_path / "README.md").read_text()
  assert "old" not in readme and "| spade | 3 |" in readme and readme.endswith("y\n")
  assert "| static | +0.300 ± 0.321 | n/a |" in readme  # no harder series: n/a
  assert (tmp_path / "eval_families_held_out_success.png").is_file()
  # The warm start's evaluation adds its row (success columns only) and must share the
  # runs' weights.
  base = {"iteration": 0, "warm_start": {"path": "/x", "sha256": "c" * 64},
          "eval": {"eval/families/held_out/success": 0.125,
                   "eval/families/harder/success": 0.25}}
  (tmp_path / "warm_start_eval.json").write_text(json.dumps(base))
  s = report.report(str(tmp_path), readme=str(tmp_path / "README.md"))
  assert s["warm start"]["held_out"]["mean"] == 0.125 and s["warm start"]["valid_rate"]["n"] == 0
  assert "| warm start (no self-play) | - | 0 | 0.125 | 0.250 | n/a |" in (
      tmp_path / "table.md").read_text()
  for seed in range(3):
    r = result("spade", seed, 0.5)
    r["warm_start"] = {"path": "/x", "sha256": "d" * 64}
    with open(tmp_path / f"spade-{seed}.json", "w") as f:
      json.dump(r, f)
  with pytest.raises(ValueError, match="evaluated other weights"):
    report.report(str(tmp_path))
  (tmp_path / "warm_start_eval.json").unlink()
  # The final checkpoints' evaluation: per arm over seeds, and the change from the start.
  final = {"limit": 16, "warm_start": {"path": "/x", "sha256": "d" * 64},
           "eval": {"eval/families/held_out/success": 0.0,
                    "eval/families/harder/success": 0.25},
           "runs": {f"spade-{i}": {"arm": "spade", "seed": i, "step": 3, "eval": {
               "eval/families/held_out/success": 0.0,
               "eval/families/harder/success": h}} for i, h in enumerate((0.25, 0.3, 0.35))}}
  final["runs"].update({f"static-{i}": {"arm": "static", "seed": i, "step": 3, "eval": {
      "eval/families/held_out/success": 0.0, "eval/families/harder/success": 0.2}}
                        for i in range(3)})
  (tmp_path / "final_eval_4.json").write_text(json.dumps(dict(final, limit=4, runs={})))
  (tmp_path / "final_eval_16.json").write_text(json.dumps(final))
  s = report.report(str(tmp_path), readme=str(tmp_path / "README.md"))
  row = s["final"]["arms"]["spade"]["eval/families/harder/success"]
  assert s["final"]["limit"] == 16 and row["mean"] == pytest.approx(0.3)
  assert row["change"] == pytest.approx(0.05) and row["n"] == 3
  assert row["ci95"] == pytest.approx(4.303 * 0.05 / math.sqrt(3))
  assert "| spade | 3 | 3 | 0.000 ± 0.000 | +0.000 | 0.300 ± 0.124 | +0.050 |" in (
      tmp_path / "final_table.md").read_text()
  # spade minus static: 0.1; pooled variance (0.005 + 0) / 4 over 1/3 + 1/3, t(4) = 2.776.
  c = s["final"]["contrasts"]["static"]["eval/families/harder/success"]
  assert c["diff"] == pytest.approx(0.1) and c["df"] == 4
  assert c["ci95"] == pytest.approx(2.776 * math.sqrt(0.00125 * 2 / 3))
  assert "| static | +0.000 ± 0.000 | +0.100 ± 0.080 |" in (
      tmp_path / "final_table.md").read_text()
  assert "spade" not in s["final"]["contrasts"]
  # One row per run: its final score and change, and its series' means.
  row = {r["run"]: r for r in s["runs"]}["spade-1"]
  assert row["final_harder"] == pytest.approx(0.3) and row["final_change"] == pytest.approx(0.05)
  assert row["regret_mean"] == pytest.approx(0.1) and row["band_share"] == pytest.approx(0.25)
  assert row["win_rate"] == pytest.approx(0.4)
  assert "| spade-1 | 3 | 0.300 | +0.050 | +0.100 | 0.400 | 0.250 | 1.000 | n/a | n/a |" in (
      tmp_path / "runs_table.md").read_text()
  assert "| static-2 | 3 | 0.200 | -0.050 |" in (tmp_path / "README.md").read_text()
  # The seen families at the designers' levels (final_eval --levels): the same table for
  # their mean success.
  key = "eval/families/seen_levels/success"
  lv = dict(final, levels=[1, 2], eval={key: 0.5}, runs={
      name: dict(r, eval={key: 0.6 if r["arm"] == "spade" else 0.55})
      for name, r in final["runs"].items()})
  (tmp_path / "final_eval_16_levels_1-2.json").write_text(json.dumps(lv))
  s = report.report(str(tmp_path), readme=str(tmp_path / "README.md"))
  row = s["final_levels"]["levels 1-2"]["arms"]["spade"][key]
  assert row["mean"] == pytest.approx(0.6) and row["change"] == pytest.approx(0.1)
  text = (tmp_path / "final_levels_table.md").read_text()
  assert "| warm start | - | 0 | 0.500 | - |" in text
  assert "| static | +0.050 ± 0.000 |" in text
  (tmp_path / "final_eval_16_levels_1-2.json").write_text(json.dumps(dict(
      lv, warm_start={"path": "/x", "sha256": "e" * 64})))
  with pytest.raises(ValueError, match="levels"):
    report.report(str(tmp_path))
  (tmp_path / "final_eval_16_levels_1-2.json").unlink()
  (tmp_path / "final_eval_16.json").write_text(json.dumps(dict(
      final, warm_start={"path": "/x", "sha256": "e" * 64})))
  with pytest.raises(ValueError, match="another warm start"):
    report.report(str(tmp_path))
  for name in ("final_eval_16.json", "final_eval_4.json"):
    (tmp_path / name).unlink()
  # Runs that began from different warm starts are not compared.
  for seed, digest in ((0, "a" * 64), (1, "b" * 64)):
    r = result("spade", seed, 0.5)
    r["warm_start"] = {"path": "/x", "sha256": digest}
    with open(tmp_path / f"spade-{seed}.json", "w") as f:
      json.dump(r, f)
  with pytest.raises(ValueError, match="different warm starts.*spade-1"):
    report.report(str(tmp_path))


def test_report_cli_prints_the_table_and_names_a_missing_results_dir(tmp_path):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cli = [sys.executable, "-m", "experiments.mechanism.report", f"--results={tmp_path}"]
  r = subprocess.run(cli, capture_output=True, text=True, cwd=root, timeout=300)
  # Nothing to report: one line that says what to run, no traceback.
  assert r.returncode == 1 and "run --arm=" in r.stderr and "Traceback" not in r.stderr
  for seed in (0, 1):
    (tmp_path / f"static-{seed}.json").write_text(json.dumps({
        "arm": "static", "seed": seed, "iterations": 2, "series": {
            "eval/families/harder/success": [[2, 0.25 * (seed + 1)]],
            "rewards/win_rate_band_frac": [[1, 0.5], [2, 0.0]]}}))
  r = subprocess.run(cli, capture_output=True, text=True, cwd=root, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "| static | 2 | 2-2 | n/a | 0.375 ± 1.588 |" in r.stdout  # t(1) 12.706 * 0.125
  assert (tmp_path / "runs_table.md").read_text().count("| static-") == 2
  assert (tmp_path / "eval_families_harder_success.png").is_file()


def test_final_eval_levels_pick_the_seen_families():
  from experiments.mechanism import final_eval
  assert final_eval.parse_levels("") is None and final_eval.parse_levels("3") == (3, 3)
  assert final_eval.parse_levels("1-2") == (1, 2)
  for bad in ("2-1", "0-5", "x", "1-"):
    with pytest.raises(ValueError, match="--levels"):
      final_eval.parse_levels(bad)
  items = final_eval.seen_levels_items((1, 2)).split(",")
  assert len(items) == len(common.seen_families()) and "ordering:1-2" in items
  assert not any(i.startswith(common.HELD_OUT) for i in items)
  scores = {"eval/families/success/ordering/1": 0.5, "eval/families/success/ordering/2": 0.0,
            f"eval/families/success/{common.HELD_OUT}/1": 1.0, "eval/families/failed": 0.0}
  assert final_eval.with_seen_levels(scores)[final_eval.SEEN_LEVELS] == pytest.approx(0.25)
  assert final_eval.with_seen_levels({"eval/families/failed": 0.0}) == {
      "eval/families/failed": 0.0}


def test_designed_levels_follow_the_memorys_programs(tmp_path):
  from spade_jax.envs.families import FAMILIES
  fams = sorted(FAMILIES)[:2]
  recs = [{"program": FAMILIES[fams[0]].program_at(0), "iteration": 0},
          {"program": FAMILIES[fams[1]].program_at(4), "iteration": 0},
          {"program": "print('not a family')", "iteration": 1},
          {"program": FAMILIES[fams[1]].program_at(4), "iteration": 2}]
  assert report.designed_levels(str(tmp_path)) == []  # no memory: no series
  (tmp_path / "memory.json").write_text(json.dumps({"version": 2, "records": recs}))
  levels = report.designed_levels(str(tmp_path))
  assert levels == [[1, 2.0], [3, 4.0]]  # steps are iterations + 1; non-family skipped
  # Levels 2 then 4 over steps 1 and 3: a slope of 1 per iteration, 10 per 10.
  run = {"arm": "spade", "seed": 0, "iterations": 3,
         "series": {report.LEVEL: levels}}
  assert report.per_run(run)["level_trend"] == pytest.approx(10.0)
  # The per-run table averages the first and last WINDOW iterations' levels.
  run["series"][report.LEVEL] = [[i + 1, float(i)] for i in range(25)]
  (row,) = report.run_rows([run])
  assert row["level_first"] == pytest.approx(4.5) and row["level_last"] == pytest.approx(19.5)
  assert row["final_harder"] is None and row["regret_mean"] is None
  assert "| spade-0 | 3 | n/a | n/a | n/a | n/a | n/a | n/a | 4.50 | 19.50 |" in (
      report.runs_table([row]))


def test_smoke_warm_start_and_one_arm(tmp_path, monkeypatch):
  """The committed commands at smoke size: the warm start, then one arm, then its JSON."""
  from experiments.mechanism import run, warm_start
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
  ws = common.warm_start_dir(smoke=True)
  levels = warm_start.build(ws, smoke=True, **dict(warm_start.DEFAULTS,
                                                   **warm_start.SMOKE_BUILD))
  assert os.path.isfile(os.path.join(ws, "hf", "config.json"))
  assert set(levels) >= {"agent_medium_sampled", "agent_medium_greedy", "designer"}
  assert 0.0 <= levels["designer"]["valid_rate"] <= 1.0
  assert json.load(open(os.path.join(ws, "levels.json"))) == levels
  rec = json.load(open(warm_start.write_results(ws, warm_start.SMOKE_BUILD, levels,
                                                str(tmp_path / "warm_start.json"))))
  assert rec["levels"] == levels and rec["data"]["designer_rows"] == 4
  assert rec["data"]["worked"] is True  # the smoke build writes worked steps
  assert [s for s, _ in rec["loss"]] == [3]  # logged every 10 steps and at the last
  # Stage 0 (copy rows) ran first and its weights started the supervised training.
  assert os.path.isfile(os.path.join(ws, "induction", "config.json"))
  assert [r["step"] for r in rec["induction"]] == [2]
  rows = [data.Example([1, 2, 15, 30, 15], [False] * 5, data.AGENT, {}),
          data.Example([9, 44], [False, True], data.AGENT, {})]
  assert warm_start.data_ids(rows) == [15, 30, 44]  # what stage 0 copies; markers left out
  # --families: the agent data's families are recorded; cached data of others is refused.
  assert rec["data"]["families"] == sorted(common.seen())
  with pytest.raises(ValueError, match="--force to rebuild the data"):
    warm_start.build_data(ws, None, designer_rows=0, agent_rows=1, families=("ordering",))
  assert warm_start.parse_families("") == ()
  assert warm_start.parse_families(" ordering,grid_path,ordering") == ("ordering", "grid_path")
  with pytest.raises(ValueError, match="not seen families"):
    warm_start.parse_families(f"ordering,{HELD_OUT}")
  with pytest.raises(ValueError, match="drop --init_from"):
    warm_start.build(str(tmp_path / "both"), smoke=True, **dict(
        warm_start.DEFAULTS, **warm_start.SMOKE_BUILD, init_from=os.path.join(ws, "hf")))
  from experiments.mechanism import diagnose
  diag = diagnose.diagnose(ws, rows_per_family=2)
  assert diag and all(r["turns"] > 0 for r in diag.values())
  for r in diag.values():  # the whole action right implies its format right
    assert 0.0 <= r["action_rate"] <= r["format_rate"] <= 1.0 and r["nats_per_token"] > 0
    assert r["action_rate"] <= r["answer_rate"] <= 1.0 and 0.0 <= r["work_rate"] <= 1.0
    assert sum(v["steps"] for v in r["result_rate_by_operator"].values()) == r[
        "equation_steps"] <= r["worked_turns"]
  assert sum(r["worked_turns"] for r in diag.values()) > 0
  from experiments.mechanism import measure
  swept = measure.by_level(os.path.join(ws, "hf"), levels=(0, 4), episodes=1,
                           families=("ordering",), keep=1)
  for r in swept.values():  # the whole episode's text, every turn
    (shown,) = r["transcripts"]
    assert shown["family"] == "ordering" and shown["text"].count("<|im_start|>user") >= 1
  assert sorted(swept) == [0, 4] and all(0.0 <= r["win_rate"] <= 1.0 for r in swept.values())
  assert all(sum(r["outcomes"].values()) == 1 for r in swept.values())
  with pytest.raises(ValueError, match="levels 0..4"):
    measure.by_level(os.path.join(ws, "hf"), levels=(5,), episodes=1, families=("ordering",))
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cli = [sys.executable, "-m", "experiments.mechanism.measure", f"--hf={ws}/hf", "--held_out"]
  r = subprocess.run(cli + ["--levels=0", "--episodes=1", f"--json={tmp_path}/held.json"],
                     capture_output=True, text=True, cwd=root, timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  held = json.loads((tmp_path / "held.json").read_text())["levels"]["0"]
  assert list(held["per_family"]) == [HELD_OUT] and sum(held["outcomes"].values()) == 1
  r = subprocess.run(cli + ["--families=ordering"], capture_output=True, text=True, cwd=root,
                     timeout=600)
  assert r.returncode != 0 and "drop --families" in r.stderr
  fit = diagnose.designer_fit(ws, rows_per_family=1)
  assert fit and all(r["rows"] == 1 and r["program_tokens"] > 100 for r in fit.values())
  for r in fit.values():  # a whole program right implies every token right
    assert 0.0 <= r["whole_rate"] <= r["top1_rate"] <= 1.0 and r["nats_per_token"] > 0
    assert 0 <= r["first_miss_median"] <= r["program_tokens"]
    assert (r["misses_beyond_knobs"] == 0) == (r["whole_rate"] == 1.0)
  fam = FAMILIES["arithmetic_chain"]
  vocab, program = ByteVocab(), fam.program(**fam.levels(2))
  ids = vocab.encode(data.designer_reply(program))
  knobs = diagnose.knob_tokens(ids, vocab)  # the knob values' bytes (TURNS too), nothing else
  turns = program.split("\nTURNS = ")[1].split()[0]
  assert vocab.decode([i for i, k in zip(ids, knobs) if k]) == "".join(
      str(v) for v in fam.levels(2).values()) + turns
  probe = diagnose.copy_probe(ws, rows=2, length=8)
  assert set(probe) == {"first_top1", "repeat_top1"}
  assert all(0.0 <= v <= 1.0 for v in probe.values())
  # --init_from: a new build starts from these weights, with a fresh optimizer.
  from spade_jax import models
  start, cfg = models.load_hf(os.path.join(ws, "hf"))
  rows = data.copy_examples(chat_of(ws), 8, seed=0)
  out = str(tmp_path / "continued")
  kw = dict(steps=1, batch_size=8, seq_len=1024, learning_rate=1e-4, checkpoint_every=1)
  moved = warm_start.train(out, cfg, rows, init_from=os.path.join(ws, "hf"), **kw)
  fresh = warm_start.train(str(tmp_path / "fresh"), cfg, rows, **kw)
  dist = lambda a, b: max(float(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))
                                .max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  # One AdamW step at 1e-4 moves a weight by about the rate at most; a fresh init lies
  # where the smoke build's three steps at 2e-3 started.
  assert dist(moved, start) <= 1.5e-4 and dist(fresh, start) > 5e-4
  with pytest.raises(ValueError, match="model shape differs"):
    warm_start.train(str(tmp_path / "other"), dataclasses.replace(cfg, d_model=32), rows,
                     init_from=os.path.join(ws, "hf"), **kw)
  path = run.run("static", 0, smoke=True, workdir=str(tmp_path / "run"))
  out = json.load(open(path))
  assert out["arm"] == "static" and out["iterations"] == 2
  assert [it for it, _ in out["series"]["eval/families/held_out/success"]] == [1, 2]
  assert len(out["series"]["rewards/win_rate_band_frac"]) == 2
  assert out["warm_start"] == {"path": os.path.abspath(os.path.join(ws, "hf")),
                               "sha256": common.weights_digest(os.path.join(ws, "hf"))}
  # The warm start's own evaluation equals an arm's at iteration 0: the same suite, the
  # same fixed seeds, greedy, every eval key the run logs.
  from experiments.mechanism import baseline
  base = json.load(open(baseline.evaluate(smoke=True, results=str(tmp_path / "base"))))
  assert base["warm_start"] == out["warm_start"] and base["iteration"] == 0
  logged = {k for k in json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
            if k.startswith("eval/") and not k.startswith("eval/time")}
  assert logged and logged <= set(base["eval"])
  assert 0.0 <= base["eval"]["eval/families/held_out/success"] <= 1.0
  # The final evaluation at the arms' seed count reproduces both: the warm start's scores,
  # and the run's last logged evaluation from its last checkpoint's weights.
  from experiments.mechanism import final_eval
  fpath = final_eval.evaluate_runs(limit=1, runs={"static-0": str(tmp_path / "run")},
                                   smoke=True, results=str(tmp_path / "base"))
  fin = json.load(open(fpath))
  assert fin["eval"] == base["eval"]
  last = json.loads(open(tmp_path / "run" / "metrics.jsonl").read().splitlines()[-1])
  assert fin["runs"]["static-0"]["step"] == 2
  assert fin["runs"]["static-0"]["eval"] == {k: last[k] for k in fin["runs"]["static-0"]["eval"]}
  assert final_eval.evaluate_runs(limit=1, runs={"static-0": str(tmp_path / "run")},
                                  smoke=True, results=str(tmp_path / "base")) == fpath
  assert json.load(open(fpath)) == fin  # nothing new: left as it was
  # At the designers' levels: every seen family at level 1, in its own file.
  lpath = final_eval.evaluate_runs(limit=1, runs={"static-0": str(tmp_path / "run")},
                                   smoke=True, results=str(tmp_path / "base"), levels=(1, 1))
  lv = json.load(open(lpath))
  assert lpath.endswith("final_eval_1_levels_1-1.json") and lv["levels"] == [1, 1]
  played = {k.split("/")[3] for k in lv["runs"]["static-0"]["eval"] if "/success/" in k}
  assert played == set(common.seen_families())
  assert 0.0 <= lv["eval"][final_eval.SEEN_LEVELS] <= 1.0
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  (elsewhere / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="began from the warm start"):
    run.run("static", 0, smoke=True, workdir=str(tmp_path / "run"), start=str(elsewhere))
  _stored_run_goes_on_elsewhere(tmp_path, ws, out)


def _stored_run_goes_on_elsewhere(tmp_path, ws, finished):
  """A run stopped after iteration 1 is stored (moments in bfloat16), then goes on from the
  store in an empty directory of another checkout, and its copy is removed once finished."""
  from experiments.mechanism import run, run_store
  first = tmp_path / "run"
  shutil.rmtree(first / "checkpoints" / "2")  # as if stopped after iteration 1
  store = str(tmp_path / "stored_runs")
  stored = run.publish("static", 0, smoke=True, workdir=str(first), store=store)
  assert stored == os.path.join(store, "static-0-smoke")
  held = run_store.read(stored)
  assert held["iteration"] == 1 and held["iterations"] == 2
  assert held["warm_start_sha256"] == finished["warm_start"]["sha256"]
  assert not set(run_store.PATH_KEYS) & set(held["config"])
  meta = run_store.metadata(os.path.join(stored, "checkpoints"), 1)["state"]
  assert {a.dtype for a in jax.tree.leaves(meta["params"])} == {np.dtype("float32")}
  moments = [a.dtype for a in jax.tree.leaves(meta["opt_state"]) if a.shape]
  assert moments and set(moments) == {np.dtype(jax.numpy.bfloat16)}
  # Stored again at the same step: left as it is.
  assert run.publish("static", 0, smoke=True, workdir=str(first), store=store) == stored
  cfg = config.get_config("arm=static,seed=0,smoke")
  digest = finished["warm_start"]["sha256"]
  with pytest.raises(ValueError, match="from a warm start with SHA-256"):
    run_store.seed(str(tmp_path / "x"), stored, cfg=cfg, warm_start_sha256="0" * 64)
  other = config.get_config("arm=static,seed=1,smoke")
  with pytest.raises(ValueError, match=r"another config \(differing: \['seed'\]"):
    run_store.seed(str(tmp_path / "x"), stored, cfg=other, warm_start_sha256=digest)
  assert not os.path.exists(tmp_path / "x")
  # Another checkout: an empty run directory takes the stored run and goes on.
  second = tmp_path / "second"
  path = run.run("static", 0, smoke=True, workdir=str(second), results=str(tmp_path / "res"),
                 store=store)
  out = json.load(open(path))
  assert out["iterations"] == 2 and out["warm_start"]["sha256"] == digest
  lines = open(second / "metrics.jsonl").read().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [1, 2]
  assert lines[0] == open(first / "metrics.jsonl").read().splitlines()[0]  # taken as it was
  assert not os.path.exists(stored)  # finished: the results JSON is the record


def test_diagnose_finds_turns_and_the_boxed_answer():
  from experiments.mechanism import diagnose
  from spade_jax.models import ByteVocab
  vocab = ByteVocab()
  assert diagnose.turns([False, True, True, False, True]) == [(1, 3), (4, 5)]
  ids = vocab.encode("obs") + vocab.encode("\\boxed{42}")
  a, b = diagnose.inner(ids, (3, len(ids)), vocab)
  assert vocab.decode(ids[a:b]) == "42}"
  assert diagnose.inner(vocab.encode("no box"), (0, 6), vocab) is None
  step = vocab.encode("59 + 6 = 65 ")
  eq = diagnose.equals_split(step, len(step), vocab)
  assert vocab.decode(step[:eq]) == "59 + 6 =" and vocab.decode(step[eq:]) == " 65 "
  assert diagnose.equals_split(vocab.encode("no equation"), 11, vocab) is None
  assert diagnose.operator("59 + 6 =") == "+" and diagnose.operator("3 * 4") == "*"
  assert diagnose.operator("-11 - 4 =") == "-" and diagnose.operator("-11 * 2 =") == "*"
  assert diagnose.operator("x is y") == "?"
  from experiments.mechanism import measure
  ids = vocab.encode("ab") + [vocab.eos_id] + vocab.encode("cd")
  assert measure.transcript(vocab, ids) == "ab<|im_end|>cd"
