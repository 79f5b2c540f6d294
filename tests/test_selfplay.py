"""Self-play: a scripted iteration through every stage, config errors, and an
end-to-end smoke run of the real launcher path with resume."""

import dataclasses
import json
import os
import sys
import types

import jax
import numpy as np
import pytest

from spade_jax import designer as dz
from spade_jax import envs, parallel, rl, sandbox, selfplay
from spade_jax.metrics import read_metrics
from spade_jax.models import ByteVocab, HFTokenizer, get_preset
from spade_jax.sampling import Generation, SamplingConfig
from spade_jax.selfplay import iteration as iteration_lib
from spade_jax.selfplay.stages import design as design_lib
from spade_jax.selfplay.stages import play as play_lib
from spade_jax.selfplay.build import make
from spade_jax.selfplay.loop import progress_line

from experiments.configs import tiny

HANGS = """```python
class HangEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        while True:
            pass
    def step(self, action):
        return "", 0.0, True, False, {}
```"""
BROKEN = "```python\nclass BrokenEnv(:\n    pass\n```"


def _designer_outputs():
  valid = "Here is my environment.\n```python\n" + envs.builtin_program("guess_secret") + "\n```"
  return [valid, HANGS, BROKEN, "I cannot write code today."]


@pytest.fixture
def scripted(monkeypatch):
  """Replaces the policy: fixed designer programs, agents always guess 50."""
  vocab = HFTokenizer(tiny.TOKENIZER)
  calls = []

  def fake_policy(prompts, max_new_tokens):
    calls.append((len(prompts), max_new_tokens))
    if max_new_tokens == 2048:  # designer
      texts = _designer_outputs()[:len(prompts)]
    else:
      texts = ["I think it is \\boxed{50}"] * len(prompts)
    toks = [vocab.encode(t)[:max_new_tokens - 1] + [vocab.eos_id] for t in texts]
    return Generation(toks, [[-1.0] * len(t) for t in toks], [True] * len(toks))

  monkeypatch.setattr(iteration_lib.SelfPlay, "_policy", lambda self, it, phase: fake_policy)
  return calls


def _selfplay(tmp_path, pool, sampling=None, reward_cfg=None, **overrides):
  cfg = get_preset("tiny", vocab_size=4096)
  mesh = parallel.make_mesh(parallel.MeshConfig())
  trainer = rl.Trainer(cfg, rl.TrainConfig(batch_size=8, seq_len=2048), rl.LossConfig(),
                       rl.OptimizerConfig(learning_rate=1e-4), mesh, parallel.RULE_SETS["fsdp"])
  kwargs = dict(skills=("logical deduction",), num_envs=4, plays=2, hinted_plays=2,
                max_turns=2, agent_turn_tokens=32, designer_new_tokens=2048,
                designer_prompt_tokens=1280, designer_resamples=0)
  sp_cfg = iteration_lib.SelfPlayConfig(**{**kwargs, **overrides})
  vocab = HFTokenizer(tiny.TOKENIZER)
  return iteration_lib.SelfPlay(
      sp_cfg, trainer=trainer, state=trainer.init_state(jax.random.key(0)), vocab=vocab,
      sampling=sampling or SamplingConfig(eos_id=vocab.eos_id), pool=pool,
      corpus=dz.Corpus(dz.CorpusConfig(), workdir=str(tmp_path)),
      memory=dz.EnvMemory(), reward_cfg=reward_cfg or selfplay.RewardConfig(credit_window=1),
      validation=envs.ValidationConfig(max_turns=2, random_episodes=2, random_steps=2,
                                        sandbox=pool.config))


@pytest.fixture(scope="module")
def pool():
  with sandbox.EnvPool(sandbox.SandboxConfig(num_workers=2, call_timeout_s=2.0,
                                             load_timeout_s=20.0)) as p:
    yield p


def test_scripted_iteration_classifies_and_trains(tmp_path, scripted, pool):
  sp = _selfplay(tmp_path, pool)
  m = sp.iteration(0)
  assert m["designer/samples"] == 4 and m["designer/valid"] == 1
  assert m["designer/rejected/timeout"] == 1
  assert m["designer/rejected/syntax"] == 1
  assert m["designer/rejected/no_code"] == 1
  # The valid program plays in slot 0; invalid slots were refilled from the pool.
  assert [s.origin for s in sp.slots] == ["designer", "pool", "pool", "pool"]
  assert m["agent/episodes"] == 4 * (2 + 2)
  # The cohort (three invalid samples, penalised, and the valid one) is credited
  # together after its credit window (1 iteration): four designer rows, then the 8
  # unhinted agent rows; the invalid penalty is centred with the cohort.
  assert m["designer/credited"] == 4 and m["designer/trained"] == 4
  assert m["designer/credit/invalid"] == 3 and m["designer/credit/played"] == 1
  assert abs(m["designer/reward_mean"]) < 1e-5
  assert m["batch/designer_rows"] == 4 and m["batch/agent_rows"] == 8
  assert m["batch/cut_tokens"] == 0  # every row fits the helper's seq_len
  assert [r["verdict"] for r in sp.sample_records] == ["valid", "timeout", "syntax", "no_code"]
  assert m["train/designer_tokens"] > 0
  # The scripted plays all score alike: zero advantages, left out of the update
  # (train.skip_zero_advantage) with their share of the denominator.
  assert m["train/agent_tokens"] == 0 and m["batch/skipped_rows"] == 8
  assert m["batch/skipped_loss_tokens"] > 0
  assert sp.memory.records and any(r.reason == "syntax" for r in sp.memory.records)
  # Nothing pending after the credit; host state survives a JSON round trip.
  host = json.loads(json.dumps(sp.host_state()))
  sp2 = _selfplay(tmp_path, pool)
  sp2.restore_host_state(host)
  assert [s.source for s in sp2.slots] == [s.source for s in sp.slots]
  assert sp2.corpus.state() == sp.corpus.state()
  assert len(sp2.memory) == len(sp.memory)


def test_invalid_samples_are_resampled(tmp_path, scripted, pool):
  sp = _selfplay(tmp_path, pool, designer_resamples=2)
  m = sp.iteration(0)
  # Calls see 4, 3 and 2 prompts; each call's first output is the valid program.
  assert m["designer/samples"] == 9 and m["designer/valid"] == 3
  assert m["designer/resampled"] == 5
  assert [s.origin for s in sp.slots] == ["designer"] * 3 + ["pool"]
  assert m["designer/credited"] == 9 and m["designer/credit/invalid"] == 6


def test_hinted_plays_use_unhinted_seeds(tmp_path, scripted, pool, monkeypatch):
  seen = []
  real = play_lib.run_episodes

  def spy(pool_, sources, specs, *a, **k):
    seen.extend(specs)
    return real(pool_, sources, specs, *a, **k)
  monkeypatch.setattr(play_lib, "run_episodes", spy)
  _selfplay(tmp_path, pool, hinted_plays=4).iteration(0)
  for e in range(4):
    plain = [s.seed for s in seen if s.env == e and not s.hinted]
    hinted = [s.seed for s in seen if s.env == e and s.hinted]
    assert len(plain) == 2 and len(hinted) == 4 and set(hinted) == set(plain)


def test_config_errors_name_the_key():
  with pytest.raises(ValueError, match=r"Unknown key\(s\) \['plays_per_env'\] in config "
                     r"section 'selfplay'"):
    make(iteration_lib.SelfPlayConfig, {"plays_per_env": 3}, "selfplay")
  with pytest.raises(ValueError, match="hint_source"):
    iteration_lib.SelfPlayConfig(hint_source="oracle")


def test_credit_window_longer_than_regeneration_is_refused(tmp_path, pool):
  with pytest.raises(ValueError, match="credit_window=4 exceeds selfplay.regen_every=1"):
    cfg = get_preset("tiny")
    mesh = parallel.make_mesh(parallel.MeshConfig())
    trainer = rl.Trainer(cfg, rl.TrainConfig(8, 64), rl.LossConfig(), rl.OptimizerConfig(),
                         mesh, parallel.RULE_SETS["fsdp"])
    iteration_lib.SelfPlay(
        iteration_lib.SelfPlayConfig(), trainer=trainer, state=None, vocab=ByteVocab(),
        sampling=SamplingConfig(), pool=pool, corpus=None, memory=dz.EnvMemory(),
        reward_cfg=selfplay.RewardConfig(credit_window=4), validation=envs.ValidationConfig())


def test_progress_line_mentions_every_phase():
  line = progress_line(0, 3, {"designer/samples": 4, "designer/valid": 1,
                              "designer/rejected/syntax": 2, "designer/rejected/no_code": 1,
                              "rewards/regret_mean": 0.25, "agent/reward_nohint": 0.1,
                              "agent/reward_hint": 0.35, "train/loss": 0.01,
                              "time/design": 1.0, "time/play": 2.0, "time/train": 0.5})
  assert line.startswith("iter 1/3 | design valid 1/4 [no_code=1 syntax=2]")
  assert "regret +0.250" in line and "nohint 0.100 hint 0.350" in line
  assert "design 1.0s" in line and "play 2.0s" in line and "train 0.5s" in line
  line = progress_line(0, 1, {"eval/families/held_out/success": 0.5,
                              "eval/families/success/guess_number/3": 1.0,
                              "eval/bfcl/accuracy": 0.25})
  assert line.endswith("| eval bfcl/accuracy 0.250 families/held_out/success 0.500")


def test_smoke_run_two_iterations_then_resume(tmp_path):
  """The tiny smoke run with held-out eval each iteration, then a resume."""
  workdir = str(tmp_path / "run")
  config = tiny.get_config("smoke")
  # One logic task, one sample of 8 tokens: the suite adds seconds, not minutes.
  config.eval = dict(suites=("reasoning_gym",), every=1, limit=1, samples=1,
                     max_new_tokens=8, batch_size=1,
                     overrides={"reasoning_gym": {"groups": ("logic",)}})
  last = selfplay.train(config, workdir)
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:  # in the iteration's own row, so a resumed run rewrites it exactly
    assert 0.0 <= r["eval/reasoning_gym/win_rate"] <= 1.0
    assert "eval/reasoning_gym/logic" in r and "eval/reasoning_gym/logic/score" in r
    assert r["time/eval"] > 0 and "train/loss" in r
  assert "eval/reasoning_gym/win_rate" in last
  for key in ("designer/valid_rate", "designer/resampled", "rewards/regret_mean",
              "agent/reward_nohint", "agent/reward_hint", "time/play", "time/train",
              "train/loss", "sampling/designer/temperature", "sampling/hint/temperature",
              "sampling/agent/top_k", "batch/skipped_rows"):
    assert key in rows[-1], key
  for r in rows:  # per-token metrics wherever a row was differentiated
    for key in ("train/tis_weight_mean", "train/designer_tis_weight_mean"):
      assert (key in r) == (r["batch/batches"] > 0), (key, r["step"])
  assert rows[0]["sampling/hint/temperature"] == 0.3
  samples = read_metrics(workdir, "designer_samples")
  assert len(samples) == rows[0]["designer/credited"] + rows[1]["designer/credited"]
  for key in ("iteration_written", "iteration_credited", "slot", "skill", "verdict", "Rh",
              "Rn0", "w", "raw", "reward", "policy_version"):
    assert key in samples[0], key
  assert sum(v for k, v in rows[0].items() if k.startswith("designer/rejected/")) + \
      rows[0]["designer/valid"] == rows[0]["designer/samples"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2"]
  assert os.path.exists(os.path.join(workdir, "memory.json"))
  assert os.path.isdir(os.path.join(workdir, "tensorboard"))
  assert last["train/loss"] == rows[-1]["train/loss"]
  # Rerun with one more iteration: resumes at step 2 and runs only step 3.
  config.iterations = 3
  selfplay.train(config, workdir)
  assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3]
  assert {r["step"] for r in read_metrics(workdir, "designer_samples")} == {1, 2, 3}


def test_skills_rotate_per_regeneration():
  skills = envs.SKILLS["games"]
  first = iteration_lib.regen_skills(skills, 3, 0, 24)
  second = iteration_lib.regen_skills(skills, 3, 1, 24)
  assert {s: first.count(s) for s in set(first)} == {s: 8 for s in skills[:3]}
  assert set(second) == set(skills[3:]) and second.count(skills[3]) == 8
  assert set(iteration_lib.regen_skills(skills, 0, 5, 12)) == set(skills)
  assert iteration_lib.regen_skills(skills[:2], 3, 1, 4) == list(skills[:2]) * 2


def test_a_skill_dealt_one_slot_is_warned_of():
  lone = selfplay.SelfPlayConfig(num_envs=4, skills_per_regen=4)
  warning = design_lib.lone_skill_warning(lone, center_by_skill=True)
  assert "leaves 4 skill(s) a single env slot" in warning
  assert "skills_per_regen to at most 2" in warning
  three = design_lib.lone_skill_warning(selfplay.SelfPlayConfig(num_envs=4, skills_per_regen=3),
                                        True)
  assert "leaves 2 skill(s)" in three  # 4 slots over 3 skills: 2, 1, 1
  assert design_lib.lone_skill_warning(selfplay.SelfPlayConfig(num_envs=24), True) is None
  # Nothing centres designer rewards by skill, or the designer does not train: no warning.
  assert design_lib.lone_skill_warning(lone, center_by_skill=False) is None
  assert design_lib.lone_skill_warning(dataclasses.replace(lone, train_designer=False),
                                       True) is None


# Crashes when an agent guesses 50, unless solution() was called on the instance (as the
# validator does before replaying it; self-play never calls it on a live episode).
CRASHES_ON_50 = envs.builtin_program("guess_secret").replace(
    "  def step(self, action", "  def step(self, action, _=None):\n"
    "    if str(action).strip() == '50' and not getattr(self, 'witness', False):\n"
    "      raise RuntimeError('boom')\n"
    "    return self._step(action)\n\n  def _step(self, action", 1).replace(
        "  def solution(self", "  def solution(self, _=None):\n    self.witness = True\n"
        "    return self._solution()\n\n  def _solution(self", 1)


def test_crashed_program_is_penalised_then_blacklisted(tmp_path, scripted, pool, monkeypatch):
  outputs = ["```python\n" + CRASHES_ON_50 + "\n```", HANGS, BROKEN, "no code"]
  monkeypatch.setattr(sys.modules[__name__], "_designer_outputs", lambda: outputs)
  sp = _selfplay(tmp_path, pool)
  m = sp.iteration(0)
  assert m["designer/valid"] == 1 and m["env/failed_slots"] >= 1
  assert m["designer/credit/failed"] == 1 and m["env/blacklisted"] == 1
  crashed = [r for r in sp.sample_records if r["verdict"] == "failed"]
  assert len(crashed) == 1 and crashed[0]["trained"]
  assert sp.slots[0].origin == "pool" and sp.fresh[0]


def _seeded_program(sp, slow=(), crash=(), win=()):
  """guess_secret, scripted per play seed: a step on a `slow` seed runs past the sandbox's
  call deadline, one on a `crash` seed raises, and a `win` seed's secret is 50 (the
  scripted agent's guess). Each argument lists (iteration, slot, play) triples."""

  def seeds(triples):
    return {sp._seed(*t) for t in triples}  # pylint: disable=protected-access

  return envs.builtin_program("guess_secret").replace(
      "    self.secret = rng.randint(self.low, self.high)\n",
      "    self.secret = rng.randint(self.low, self.high)\n"
      f"    self.secret = 50 if seed in {seeds(win)!r} else self.secret\n"
      "    self.seed = seed\n", 1).replace(
          "  def step(self, action):\n",
          "  def step(self, action):\n"
          f"    while self.seed in {seeds(slow)!r}:\n"
          "      pass\n"
          f"    if self.seed in {seeds(crash)!r}:\n"
          "      raise RuntimeError('boom')\n", 1)


def test_timeout_mid_window_keeps_its_score_until_credit(tmp_path, scripted, pool,
                                                         monkeypatch):
  # regret_based over a 4-rollout window, one skill: slot 0's program times out in the
  # window's 2nd rollout and slot 1's crashes there (both blacklisted and refilled from
  # the pool before the credit), slot 2's times out in the last rollout, and slot 3's
  # plays the whole window, winning only the regeneration step's plays.
  reward_cfg = selfplay.RewardConfig(variant="regret_based", credit_window=4)
  sp = _count_steps_only(_selfplay(tmp_path, pool, reward_cfg=reward_cfg, regen_every=4))
  program = _seeded_program(sp, slow=[(1, 0, 0), (3, 2, 0)], crash=[(1, 1, 0)],
                            win=[(0, 3, 0), (0, 3, 1)])
  monkeypatch.setattr(sys.modules[__name__], "_designer_outputs",
                      lambda: ["```python\n" + program + "\n```"] * 4)
  sp.iteration(0)
  assert [s.origin for s in sp.slots] == ["designer"] * 4
  m1 = sp.iteration(1)
  assert m1["agent/nohint/timeout"] == 1 / 8 and m1["agent/nohint/crash"] == 1 / 8
  assert m1["env/blacklisted"] == 2 and [s.origin for s in sp.slots[:2]] == ["pool"] * 2
  # The pending samples (and what they failed with) survive a checkpoint.
  host = json.loads(json.dumps(sp.host_state()))
  sp.restore_host_state(host)
  sp.iteration(2)
  m3 = sp.iteration(3)
  assert m3["designer/credited"] == 4 and m3["designer/credit/failed"] == 3
  records = {r["slot"]: r for r in sp.sample_records}
  # docs/METHOD.md §2: a timed-out env scores -0.5, a crash the crash penalty (-1); slot 3's
  # regret is Rh - w = 1 - 2/8. Centred on the cohort's mean, times 2 plays * 4 = 8.
  raw = [-0.5, -1.0, -0.5, 1.0 - 2 / 8]
  want = [(v - sum(raw) / 4) * 8 for v in raw]
  assert [records[e]["reward"] for e in range(4)] == pytest.approx(want, abs=1e-5)
  assert all(records[e]["trained"] for e in range(4))
  assert [records[e]["failure"] for e in range(4)] == ["timeout", "crash", "timeout", None]
  assert [records[e]["raw"] for e in range(4)] == pytest.approx([-0.5, None, -0.5, 0.75])
  # A checkpoint written before samples kept their failure marks a failed one `failed`:
  # it restores as a crash, as such a sample was credited then.
  for p in host["pending"]:
    p["failed"] = p.pop("failure") is not None
    del p["failure_raw"]
  sp.restore_host_state(host)
  assert [p.failure for p in sp.pending] == ["crash", "crash", None, None]


def test_eval_runs_every_n_iterations_and_after_the_last():
  from spade_jax.eval import EvalConfig  # pylint: disable=g-import-not-at-top
  due = lambda cfg: [selfplay.eval_due(cfg, it, 5) for it in range(5)]  # noqa: E731
  assert due(EvalConfig(suites=("reasoning_gym",), every=2)) == [False, True, False, True, True]
  assert due(EvalConfig(suites=("reasoning_gym",))) == [False] * 4 + [True]
  assert not any(due(EvalConfig(every=1)))  # no suites: off


def test_dynamic_sampling_drops_uniform_groups_from_the_gradient(tmp_path, scripted, pool):
  sp = _selfplay(tmp_path, pool, dynamic_sampling=True)
  m = sp.iteration(0)
  # The scripted agent always answers 50: every env's plays end alike, so no agent row
  # is trained, while win rates and regret still see every play.
  assert m["agent/uniform_groups_dropped"] == 4
  assert m["batch/agent_rows"] == 0 and m["batch/designer_rows"] == 4
  assert m["agent/episodes"] == 4 * (2 + 2)


def test_overlap_play_reaches_the_episode_runner(tmp_path, scripted, pool, monkeypatch):
  # The schedules' transcripts are compared in test_episodes; here only the switch.
  seen = []

  class Stop(Exception):
    pass

  def spy(*args, **kwargs):
    seen.append(kwargs.get("overlap"))
    raise Stop

  monkeypatch.setattr(play_lib, "run_episodes", spy)
  for overlap, cohorts in ((False, 0), (True, 0), (True, 3)):
    with pytest.raises(Stop):
      _selfplay(tmp_path, pool, overlap_play=overlap, play_cohorts=cohorts).iteration(0)
  assert seen == [False, True, 3]
  with pytest.raises(ValueError, match="needs selfplay.overlap_play"):
    selfplay.SelfPlayConfig(play_cohorts=2)
  with pytest.raises(ValueError, match="k >= 2"):
    selfplay.SelfPlayConfig(overlap_play=True, play_cohorts=1)


def _designer_calls(calls):
  return [n for n, new in calls if new == 2048]


def _count_steps_only(sp):
  """Replaces the train step by a step count (these tests are about the design order)."""
  sp.trainer = type("T", (), {"train_cfg": sp.trainer.train_cfg, "model_cfg": sp.trainer.model_cfg,
                              "mesh": sp.trainer.mesh, "rules": sp.trainer.rules,
                              "widths": set(), "width_waste": {},
                              "skips_zero_advantage": False,
                              "step": lambda self, st, b, extra_denom=0.0: (
                                  st.replace(step=st.step + 1), {})})()
  return sp


def test_design_ahead_draws_the_next_regeneration_during_the_plays(tmp_path, scripted, pool):
  sp = _count_steps_only(_selfplay(tmp_path, pool, design_ahead=True, regen_every=2))
  sp.iteration(0)
  assert sp.ahead is None
  scripted.clear()
  m1 = sp.iteration(1)  # the last iteration of the cohort draws the next one's designs
  assert _designer_calls(scripted) == [4] and m1["designer/ahead_samples"] == 4
  assert "designer/samples" not in m1 and sp.ahead.iteration == 2
  assert sp.ahead.version == 1  # the weights after one update, before iteration 1's
  host, state = json.loads(json.dumps(sp.host_state())), sp.state
  scripted.clear()
  m2 = sp.iteration(2)
  # Nothing changed the prompts meanwhile: every slot takes its sample drawn ahead, no
  # designer call runs now, and the samples keep the version they were drawn with.
  assert _designer_calls(scripted) == []
  assert m2["designer/ahead_used"] == 4 and m2["designer/ahead_stale"] == 0
  assert m2["designer/samples"] == 4 and m2["designer/valid"] == 1
  assert [s.origin for s in sp.slots] == ["designer", "pool", "pool", "pool"]
  drawn = [r for r in sp.sample_records if r["iteration_written"] == 2]
  assert len(drawn) == 4 and {r["policy_version"] for r in drawn} == {1}
  # A resumed run (host state through JSON) designs iteration 2 the same way.
  sp2 = _count_steps_only(_selfplay(tmp_path, pool, design_ahead=True, regen_every=2))
  sp2.restore_host_state(host)
  sp2.state = state
  m2b = sp2.iteration(2)
  for k in ("designer/ahead_used", "designer/valid", "designer/samples"):
    assert m2b[k] == m2[k], k
  assert [s.source for s in sp2.slots] == [s.source for s in sp.slots]
  # Had the memory changed the prompts (a record in the win-rate band shows as an
  # exemplar in every prompt of the skill), each slot is drawn again at the regeneration,
  # as the reference order would, with the current weights.
  sp3 = _count_steps_only(_selfplay(tmp_path, pool, design_ahead=True, regen_every=2))
  sp3.restore_host_state(host)
  sp3.state = state
  sp3.memory.add(dz.MemoryRecord(program=envs.builtin_program("guess_secret"),
                                 skill="logical deduction", setting="games",
                                 win_rate_nohint=0.5, regret=0.3, iteration=1))
  scripted.clear()
  m2c = sp3.iteration(2)
  assert _designer_calls(scripted) == [4]
  assert m2c["designer/ahead_used"] == 0 and m2c["designer/ahead_stale"] == 4
  drawn = [r for r in sp3.sample_records if r["iteration_written"] == 2]
  assert {r["policy_version"] for r in drawn} == {2}


def test_design_ahead_config_errors(tmp_path, pool):
  with pytest.raises(ValueError, match="design_ahead.*has no designer"):
    iteration_lib.SelfPlayConfig(design_ahead=True, env_source="static_pool", hinted_plays=0)
  vocab = HFTokenizer(tiny.TOKENIZER)
  rule = SamplingConfig(eos_id=vocab.eos_id)
  mixed = iteration_lib.RoleSampling(SamplingConfig(temperature=0.6, eos_id=vocab.eos_id),
                                     rule, rule)
  with pytest.raises(ValueError, match="designer_sampling=.*differs from sampling"):
    _selfplay(tmp_path, pool, sampling=mixed, design_ahead=True)


def test_design_ahead_decodes_designs_on_the_agent_engine(tmp_path, pool, monkeypatch):
  # The real policy: the next regeneration's designs go to the episode runner as
  # requests beside the plays, and the regeneration takes them.
  seen = []
  real = play_lib.run_episodes_with_requests

  def spy(*args, **kwargs):
    seen.append(len(args[6]))
    return real(*args, **kwargs)

  monkeypatch.setattr(play_lib, "run_episodes_with_requests", spy)
  sp = _count_steps_only(_selfplay(tmp_path, pool, design_ahead=True, designer_new_tokens=48,
                                   max_turns=1, agent_turn_tokens=8, hinted_plays=1, plays=1))
  m0 = sp.iteration(0)
  assert seen == [4] and m0["designer/ahead_samples"] == 4
  assert m0["sampling/designer/ahead_tokens"] > 0
  assert all(len(t) > 0 for t in sp.ahead.tokens)
  m1 = sp.iteration(1)
  assert m1["designer/ahead_used"] + m1["designer/ahead_stale"] == 4
  assert m1["designer/samples"] == 4
  drawn = [p.policy_version for p in sp.pending if p.iteration == 1] + [
      r["policy_version"] for r in sp.sample_records if r["iteration_written"] == 1]
  assert drawn.count(0) == m1["designer/ahead_used"]


def test_shuffled_agent_advantages_are_the_same_values_on_other_rows():
  from spade_jax.selfplay.stages import credit  # pylint: disable=g-import-not-at-top
  ep = lambda n, failed=False: types.SimpleNamespace(  # noqa: E731
      tokens=[n] * 3, loss_mask=[True] * 3, logps=[0.0] * 3, failed=failed)
  nohint = {(e, j): ep(10 * e + j) for e in range(3) for j in range(4)}
  nohint[0, 1] = ep(1, failed=True)  # a failed play is never a row
  adv = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
  plain = credit.agent_rows(nohint, adv, {2}, 0.6)  # slot 2: a uniform group
  assert [(r.tokens[0], r.advantage) for r in plain] == [
      (0, -5.0), (2, -3.0), (3, -2.0), (10, -1.0), (11, 0.0), (12, 1.0), (13, 2.0)]
  runs = [credit.agent_rows(nohint, adv, {2}, 0.6, shuffle=(0, it)) for it in (0, 0, 1)]
  for rows in runs:  # the same episodes and the same multiset of advantages
    assert [r.tokens for r in rows] == [r.tokens for r in plain]
    assert sorted(r.advantage for r in rows) == sorted(r.advantage for r in plain)
    assert all(r.role == "agent" and r.temperature == 0.6 for r in rows)
  assert [r.advantage for r in runs[0]] == [r.advantage for r in runs[1]]  # seeded
  assert [r.advantage for r in runs[0]] != [r.advantage for r in plain]
  assert [r.advantage for r in runs[0]] != [r.advantage for r in runs[2]]  # per iteration
