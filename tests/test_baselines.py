"""Baselines (docs/METHOD.md §7): the RLVE difficulty rule, RLVE task programs, the static pool
(without replacement, reshuffled, resumed), the env-source switch, and both baselines'
smoke configs through the training loop."""

import json
import os

import numpy as np
import pytest

from spade_jax import envs, sandbox, selfplay
from spade_jax.metrics import read_metrics
from spade_jax.selfplay import baselines, rlve
from spade_jax.selfplay.iteration import SelfPlayConfig

from experiments.configs import baselines as baseline_configs


def _controller(**kw):
  return rlve.DifficultyController({"a": 20, "b": 20}, **kw)


# -- the difficulty rule ---------------------------------------------------------------------


def test_h_rises_after_128_attempts_at_h_with_accuracy_09():
  c = _controller()
  assert c.bounds("a") == (0, 0)
  c.record("a", 0, [True] * 127)
  assert c.update() == [] and c.bounds("a") == (0, 0)  # 127 attempts: no check yet
  c.record("a", 0, [True])
  assert c.update() == ["a"] and c.bounds("a") == (0, 1)  # l = max(0, 1 - 3)
  assert c.families["a"].attempts == 0 and c.bounds("b") == (0, 0)
  # 116/128 = 0.906 >= 0.9 raises; 115/128 = 0.898 does not, and the counters restart.
  c.record("a", 1, [True] * 115 + [False] * 13)
  assert c.update() == [] and c.bounds("a") == (0, 1)
  assert (c.families["a"].attempts, c.families["a"].correct) == (0, 0)
  c.record("a", 1, [True] * 116 + [False] * 12)
  assert c.update() == ["a"] and c.bounds("a") == (0, 2)


def test_only_plays_at_the_top_level_count():
  c = _controller()
  for h in range(3):
    c.record("a", h, [True] * 128)
    c.update()
  assert c.bounds("a") == (0, 3)
  c.record("a", 2, [True] * 500)  # below h: not an attempt
  c.record("a", 1, [True] * 500)
  assert c.families["a"].attempts == 0 and c.update() == []


def test_window_keeps_four_levels_and_h_stops_at_the_hardest():
  c = rlve.DifficultyController({"a": 6})
  seen = []
  for _ in range(8):
    h = c.bounds("a")[1]
    c.record("a", h, [True] * 128)
    c.update()
    seen.append(c.bounds("a"))
  # h+1 each time; l = max(l, h - 3); h stops at 6.
  assert seen == [(0, 1), (0, 2), (0, 3), (1, 4), (2, 5), (3, 6), (3, 6), (3, 6)]


def test_accuracy_exactly_at_threshold_raises():
  c = rlve.DifficultyController({"a": 5}, attempts=10, accuracy=0.9, window=2)
  c.record("a", 0, [True] * 9 + [False])
  assert c.update() == ["a"] and c.bounds("a") == (0, 1)
  c.record("a", 1, [True] * 9 + [False])
  assert c.update() == ["a"] and c.bounds("a") == (1, 2)  # window 2: l = h - 1


def test_levels_are_drawn_uniformly_from_the_window():
  c = _controller()
  c.families["a"].low, c.families["a"].high = 2, 5
  rng = np.random.default_rng(0)
  draws = np.array([c.draw("a", rng) for _ in range(8000)])
  assert set(draws.tolist()) == {2, 3, 4, 5}
  freq = np.bincount(draws, minlength=6)[2:] / len(draws)
  assert np.all(np.abs(freq - 0.25) < 0.02), freq


def test_controller_state_round_trips():
  c = _controller()
  c.record("a", 0, [True] * 128)
  c.update()
  c.record("a", 1, [True, False])
  d = _controller()
  d.restore(json.loads(json.dumps(c.state())))
  assert d.state() == c.state()
  with pytest.raises(ValueError, match="no state for families"):
    rlve.DifficultyController({"a": 3, "z": 3}).restore(c.state())


def test_rlve_config_and_families_are_checked():
  with pytest.raises(ValueError, match="attempts"):
    rlve.RLVEConfig(attempts=0)
  assert rlve.RLVEConfig(families="gcd,lcm").families == ("gcd", "lcm")
  with pytest.raises(ValueError, match="its own score_answer"):
    rlve.check_family("chain_sum")
  with pytest.raises(ValueError, match="not a reasoning-gym dataset"):
    rlve.check_family("no_such_family")


# -- RLVE tasks as env programs ----------------------------------------------------------------


def _run_program(source: str, turn: str) -> float:
  namespace: dict = {}
  exec(compile(source, "<rlve task>", "exec"), namespace)  # our own generated code
  env = namespace["TaskEnv"](max_turns=1)
  env.reset(seed=0)
  return env.step(turn)[1]


def test_task_program_scores_like_reasoning_gym_exact_match():
  import reasoning_gym  # pylint: disable=g-import-not-at-top
  from spade_jax.eval import answers  # pylint: disable=g-import-not-at-top
  for family in ("gcd", "word_sequence_reversal", "aiw"):
    task = rlve.generate(family, 1, seed=7)
    assert rlve.generate(family, 1, seed=7) == task  # deterministic
    source = rlve.task_program(task)
    assert envs.check_static(source)[0] is None
    scorer = reasoning_gym.create_dataset(family, size=1, seed=0).score_answer
    oracle = task["answer"]
    for turn in (f"\\boxed{{{oracle}}}", f"<think>\\boxed{{0}}</think> so \\boxed{{ {oracle} }}",
                 f"<answer>{oracle}</answer>", f"\\boxed{{{oracle}}} then \\boxed{{x}}",
                 f"\\boxed{{{oracle}0}}", oracle, f"<think>\\boxed{{{oracle}}}", ""):
      expected = scorer(answers.final_answer(turn)[0], {"answer": oracle}) >= 1.0
      assert _run_program(source, turn) == float(expected), (family, turn)


@pytest.fixture(scope="module")
def pool():
  with sandbox.EnvPool(sandbox.SandboxConfig(num_workers=2, call_timeout_s=2.0,
                                             load_timeout_s=20.0)) as p:
    yield p


def test_task_program_runs_raw_in_the_sandbox_and_validates(pool):
  task = rlve.generate("lcm", 0, seed=3)
  source = rlve.task_program(task)
  [h] = envs.start(pool, [source], "games", 1)
  try:
    assert h.action_mode == "raw"  # the program reads \boxed itself
    obs, _ = pool.reset_many([h], seeds=[5])[0].value
    assert task["question"] in obs and "\\boxed{}" in obs
    res = pool.step_many([h], [f"<think>hmm</think>It is \\boxed{{{task['answer']}}}."])[0]
    assert res.value[1:3] == (1.0, True)
  finally:
    pool.release([h])
  v = envs.validate_program(source, pool, envs.ValidationConfig(
      max_turns=1, random_episodes=2, random_steps=1, extract=False, sandbox=pool.config))
  assert v.valid, (v.reason, v.detail)


def test_rlve_source_draws_deterministically_and_moves_the_window():
  cfg = rlve.RLVEConfig(families=("gcd",), attempts=4)
  src = baselines.RLVESource(cfg, setting="games", seed=1)
  first = src.draw(0, 3, None)
  again = baselines.RLVESource(cfg, setting="games", seed=1).draw(0, 3, None)
  assert [d.source for d in first] == [d.source for d in again]
  assert {d.origin for d in first} == {"rlve"} and all(d.doc_id.count("/") == 2 for d in first)
  assert len({d.source for d in first}) == 3  # one problem per slot
  assert [d.source for d in src.draw(1, 3, None)] != [d.source for d in first]
  # 3 slots x 2 solved plays at level 0 = h: 6 >= 4 attempts at accuracy 1, so h rises.
  mask = np.array([[True, True], [True, True], [True, False]])
  m = src.observe(1, np.ones((3, 2), np.float32), mask)
  assert m["rlve/raised"] == 1 and (m["rlve/gcd/low"], m["rlve/gcd/high"]) == (0, 1)
  assert m["rlve/level_mean"] == 0.0
  state = json.loads(json.dumps(src.state()))
  other = baselines.RLVESource(cfg, setting="games", seed=1)
  other.restore(state)
  assert other.state() == src.state()
  assert [d.source for d in other.draw(2, 3, None)] == [d.source for d in src.draw(2, 3, None)]
  with pytest.raises(ValueError, match="selfplay.setting='games'"):
    baselines.RLVESource(cfg, setting="tool_use")


# -- the static pool ---------------------------------------------------------------------------


def _pool_dir(tmp_path, extra=None):
  d = tmp_path / "pool"
  d.mkdir()
  for name, src in envs.builtin_programs("games").items():
    (d / f"{name}.py").write_text(src)
  (d / "z_copy.py").write_text(envs.builtin_program("guess_secret"))
  (d / "notes.txt").write_text("not a program")
  for name, src in (extra or {}).items():
    (d / name).write_text(src)
  return str(d)


def test_static_pool_without_replacement_reshuffled_and_resumed(tmp_path):
  path = _pool_dir(tmp_path)
  cfg = baselines.StaticPoolConfig(path=path, validate=False)
  make = lambda seed=3: baselines.StaticPool(cfg, setting="games",  # noqa: E731
                                             validation=envs.ValidationConfig(), seed=seed)
  sp = make()
  assert len(sp.programs) == 5
  draws = [d.doc_id for it in range(5) for d in sp.draw(it, 2, None)]
  # Two epochs of the 5 programs, each a permutation; the second is reshuffled.
  assert sorted(draws[:5]) == sorted(sp.programs) == sorted(draws[5:])
  assert draws[:5] != draws[5:]
  same, other = make(), make(seed=4)
  assert [d.doc_id for it in range(5) for d in same.draw(it, 2, None)] == draws
  assert [d.doc_id for it in range(5) for d in other.draw(it, 2, None)] != draws
  # Resume after iteration 2 (mid-epoch): the restored pool continues the same sequence.
  first = make()
  for it in range(3):
    first.draw(it, 2, None)
  resumed = make()
  resumed.restore(json.loads(json.dumps(first.state())))
  assert [d.doc_id for it in (3, 4) for d in resumed.draw(it, 2, None)] == draws[6:]
  assert resumed.observe(4, None, None)["static_pool/drawn"] == 10


def test_static_pool_loads_jsonl_rows(tmp_path):
  rows = [{"id": "g", "program": envs.builtin_program("guess_secret")},
          {"source": "```python\n" + envs.builtin_program("grid_walk") + "\n```"},
          {"program": "no code here"}]
  path = tmp_path / "pool.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
  programs = baselines.load_programs(str(path), "games")
  assert list(programs) == ["g", "pool.jsonl:2"]  # the row without code is skipped
  assert programs["pool.jsonl:2"].startswith('"""')  # the fenced program was extracted
  with pytest.raises(ValueError, match="no program under 'code'"):
    baselines.load_programs(str(path), "games", key="code")
  with pytest.raises(FileNotFoundError, match="static_pool.path"):
    baselines.load_programs(str(tmp_path / "missing"), "games")
  assert list(baselines.load_programs("", "tool_use")) == list(envs.programs.BUILTIN["tool_use"])


def test_static_pool_validates_once_and_skips_invalid(tmp_path, pool):
  path = _pool_dir(tmp_path, {"broken.py": "class BrokenEnv(:\n  pass\n"})
  sp = baselines.StaticPool(
      baselines.StaticPoolConfig(path=path), setting="games", seed=0,
      validation=envs.ValidationConfig(max_turns=8, random_episodes=2, random_steps=2,
                                       sandbox=pool.config))
  drawn = sp.draw(0, 3, pool)
  assert sp.skipped == {"broken.py": "syntax"} and len(sp.valid) == 5
  assert "broken.py" not in {d.doc_id for d in drawn}
  valid = list(sp.valid)
  sp.draw(1, 3, None)  # validated once: no pool needed again
  assert sp.valid == valid


# -- the switch ----------------------------------------------------------------------------------


def test_env_source_switch_is_checked():
  with pytest.raises(ValueError, match="Set selfplay.env_source to one of them"):
    SelfPlayConfig(env_source="oracle")
  with pytest.raises(ValueError, match="hinted_plays=0"):
    SelfPlayConfig(hinted_plays=0)
  assert SelfPlayConfig(env_source="rlve", hinted_plays=0).hinted_plays == 0
  assert baselines.make_env_source("designer") is None
  assert isinstance(baselines.make_env_source("static_pool"), baselines.StaticPool)
  with pytest.raises(ValueError, match=r"Unknown key\(s\) \['fixed_pool'\]"):
    selfplay.make(SelfPlayConfig, {"fixed_pool": True}, "selfplay")


# -- smoke runs through the training loop --------------------------------------------------------


def test_rlve_smoke_one_iteration(tmp_path):
  config = baseline_configs.get_config("kind=rlve,smoke")
  config.iterations = 1
  workdir = str(tmp_path / "rlve")
  selfplay.train(config, workdir)
  [row] = read_metrics(workdir)
  assert row["rlve/level_mean"] == 0.0 and row["rlve/gcd/high"] == 0
  assert row["agent/episodes"] == 2 * 2 and row["batch/designer_rows"] == 0
  assert row["batch/agent_rows"] > 0 and "train/loss" in row
  assert not any(k.startswith("designer/") for k in row)
  assert read_metrics(workdir, "designer_samples") == []


def test_static_pool_smoke_resumes_its_draws(tmp_path):
  config = baseline_configs.get_config("kind=static_pool,smoke")
  assert config.static_pool.path.endswith(".jsonl") and os.path.isfile(config.static_pool.path)
  config.iterations = 1
  workdir = str(tmp_path / "pool")
  selfplay.train(config, workdir)
  config.iterations = 2
  selfplay.train(config, workdir)  # resumes at step 1: the pool continues, not revalidated
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  assert [r["static_pool/drawn"] for r in rows] == [2, 4]
  # At the smoke's 2 turns, two built-in games cannot be solved: validation skips them.
  assert rows[0]["static_pool/programs"] == 2 and rows[0]["static_pool/skipped"] == 2
  assert all(r["batch/designer_rows"] == 0 and r["agent/episodes"] == 4 for r in rows)


def test_baseline_configs_carry_the_recipe_numbers():
  r = baseline_configs.get_config("kind=rlve,model=qwen3_8b")
  assert (r.iterations, r.selfplay.num_envs, r.selfplay.plays, r.selfplay.hinted_plays,
          r.selfplay.regen_every, r.loss.kl_coef) == (400, 16, 16, 0, 1, 0.0)
  assert r.selfplay.env_source == "rlve" and r.selfplay.max_turns == 1
  assert (r.rlve.attempts, r.rlve.accuracy, r.rlve.window) == (128, 0.9, 4)
  p = baseline_configs.get_config("kind=static_pool,pool=/data/pool.jsonl")
  assert (p.iterations, p.selfplay.num_envs, p.selfplay.plays, p.selfplay.hinted_plays,
          p.loss.kl_coef, p.static_pool.path) == (400, 24, 8, 0, 0.0, "/data/pool.jsonl")
  assert baseline_configs.get_config("kind=static_pool,model=qwen3_8b").loss.kl_coef == 0.005
  for arg in ("kind=rlve", "kind=static_pool,mesh=v5p-128"):
    c = selfplay.resolve(baseline_configs.get_config(arg), dry_run=True)
    assert c.selfplay.env_source == arg.split(",")[0][5:] and c.eval.suites == ()
  with pytest.raises(ValueError, match="Unknown kind 'designer'"):
    baseline_configs.get_config("kind=designer")
