"""The ``families`` suite: env families played in the sandbox, as self-play plays them."""

import os
import re

import jax
import pytest

from spade_jax import eval as ev
from spade_jax import models, sampling, sandbox
from spade_jax.designer import agent_system_prompt
from spade_jax.envs.families import FAMILIES, HELD_OUT
from spade_jax.eval import families as fam_eval
from spade_jax.sampling import Generation
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "experiments", "tokenizers", "tiny_bpe_4k")
WRONG = "I am not sure. \\boxed{pass}"


@pytest.fixture(scope="module")
def chat():
  return models.ChatTemplate(models.HFTokenizer(TOKENIZER), thinking=False)


@pytest.fixture(scope="module")
def pool():
  with sandbox.EnvPool(sandbox.SandboxConfig(num_workers=2, call_timeout_s=10.0,
                                             load_timeout_s=30.0, self_test=False)) as p:
    yield p


def _guess(text: str) -> str:
  """Binary search on the "too low" / "too high" feedback in the transcript."""
  high = int(re.search(r"Guess my integer from 1 to (\d+)", text).group(1))
  lo, hi = 1, high
  for guess, way in re.findall(r"(\d+) is too (low|high)", text):
    if way == "low":
      lo = max(lo, int(guess) + 1)
    else:
      hi = min(hi, int(guess) - 1)
  return f"\\boxed{{{(lo + hi) // 2}}}"


def _chain(text: str) -> str:
  """The running value after every operation the transcript has revealed."""
  value = int(re.search(r"Start with (-?\d+)\.", text).group(1))
  for kind, operand in re.findall(r"Operation \d+: (add|subtract|multiply by) (\d+)", text):
    value = {"add": value + int(operand), "subtract": value - int(operand),
             "multiply by": value * int(operand)}[kind]
  return f"\\boxed{{{value}}}"


def _solver(text: str) -> str:
  if "Guess my integer" in text:
    return _guess(text)
  if "Start with" in text and "Operation 1:" in text:
    return _chain(text)
  return WRONG


def _run(chat, pool, reply, **cfg):
  [result] = ev.evaluate(ev.ScriptedPolicy(chat.vocab, reply), chat, ["families"],
                         {"families": cfg}, pool=pool).values()
  return result


def test_default_items_are_the_held_out_family_and_hard_seen_levels():
  items = ev.suite_config("families").items()
  assert [lv for f, lv in items if f == HELD_OUT] == [0, 1, 2, 3, 4]
  seen = [n for n in FAMILIES if n != HELD_OUT]
  assert sorted((f, lv) for f, lv in items if f != HELD_OUT) == sorted(
      (n, lv) for n in seen for lv in (3, 4))
  cfg = ev.suite_config("families")
  assert cfg.temperature == 0.0 and cfg.max_new_tokens == 48
  assert cfg.seed_list() == [10_000 + i for i in range(8)]
  assert ev.suite_config("families", {"limit": 3}).seed_list() == [10_000, 10_001, 10_002]


def test_a_wrong_answer_solves_nothing(chat, pool):
  result = _run(chat, pool, lambda text: WRONG, families=f"{HELD_OUT}:0-1,guess_number:3",
                seeds=2, samples=2)
  assert result.scores == {"held_out/success": 0.0, "harder/success": 0.0,
                           f"success/{HELD_OUT}/0": 0.0, f"success/{HELD_OUT}/1": 0.0,
                           "success/guess_number/3": 0.0, "failed": 0.0,
                           "held_out/pass@k": 0.0, f"pass@k/{HELD_OUT}/0": 0.0,
                           f"pass@k/{HELD_OUT}/1": 0.0, "pass@k/guess_number/3": 0.0,
                           # Every answer after a play's first repeats it.
                           "repeats": 1.0, f"repeats/{HELD_OUT}/0": 1.0,
                           f"repeats/{HELD_OUT}/1": 1.0, "repeats/guess_number/3": 1.0}
  assert len(result.records) == 3 * 2 * 2
  assert [(r["family"], r["level"], r["seed"], r["sample"]) for r in result.records[:5]] == [
      (HELD_OUT, 0, 10_000, 0), (HELD_OUT, 0, 10_000, 1), (HELD_OUT, 0, 10_001, 0),
      (HELD_OUT, 0, 10_001, 1), (HELD_OUT, 1, 10_000, 0)]
  for r in result.records:
    fam = FAMILIES[r["family"]]
    turns = fam.max_turns(**fam.levels(r["level"]))
    assert r["outcome"] == "terminated" and not r["solved"] and r["reward"] == 0.0, r
    assert r["turns"] == turns and r["actions"] == [WRONG] * turns, r


def test_pass_at_k_and_greedy_count_seeds(chat, pool):
  """pass@k counts a seed won by any of its samples; greedy adds one play per seed."""
  result = _run(chat, pool, _solver, families="guess_number:3", seeds=2, samples=2,
                greedy=True, temperature=0.6)
  assert result.scores["pass@k/guess_number/3"] == 1.0
  assert result.scores["greedy/guess_number/3"] == 1.0
  assert "held_out/greedy" not in result.scores
  assert [r["greedy"] for r in result.records] == [False] * 4 + [True] * 2
  assert [r["seed"] for r in result.records if r["greedy"]] == [10_000, 10_001]
  wrong = _run(chat, pool, lambda text: WRONG, families=f"{HELD_OUT}:0", seeds=1, greedy=True)
  assert wrong.scores["held_out/greedy"] == 0.0 and "held_out/pass@k" not in wrong.scores


def test_a_policy_that_reads_the_transcript_solves_its_families(chat, pool):
  result = _run(chat, pool, _solver,
                families=f"{HELD_OUT}:4,guess_number:3-4,arithmetic_chain:hard-hardest",
                seeds=3, max_len=8192)
  # The held-out plays give "pass" every turn; a binary search never guesses twice.
  repeats = {k: result.scores.pop(k) for k in list(result.scores) if k.startswith("repeats")}
  assert repeats[f"repeats/{HELD_OUT}/4"] == 1.0
  assert repeats["repeats/guess_number/3"] == repeats["repeats/guess_number/4"] == 0.0
  assert 0.0 < repeats["repeats"] < 1.0
  assert result.scores == {"held_out/success": 0.0, "harder/success": 1.0,
                           f"success/{HELD_OUT}/4": 0.0, "success/guess_number/3": 1.0,
                           "success/guess_number/4": 1.0, "success/arithmetic_chain/3": 1.0,
                           "success/arithmetic_chain/4": 1.0, "failed": 0.0}
  solved = [r for r in result.records if r["family"] != HELD_OUT]
  assert len(solved) == 4 * 3
  assert all(r["outcome"] == "solved" and r["reward"] == 1.0 for r in solved)
  assert len({tuple(r["actions"]) for r in solved if r["family"] == "guess_number"}) > 1


def test_repeated_answers_count_a_plays_boxed_answers_given_before():
  assert fam_eval.repeated_answers([]) == (0, 0)
  assert fam_eval.repeated_answers(["\\boxed{Bo}"]) == (0, 0)
  # The last box of a turn is its answer; a turn without one is its stripped text.
  turns = ["\\boxed{Bo}", "so \\boxed{x} no \\boxed{Ada}", " Bo ", "\\boxed{Ada}", "Cy"]
  assert fam_eval.repeated_answers(turns) == (2, 4)


def test_a_transcript_past_max_len_is_not_solved(chat, pool):
  # The whole solved game takes about 330 tokens, its first prompt about 150.
  result = _run(chat, pool, _solver, families="guess_number:4", seeds=1, max_len=260)
  [record] = result.records
  assert record["outcome"] == "context" and not record["solved"] and record["turns"] >= 1
  assert record["tokens"] <= 260
  assert result.scores["success/guess_number/4"] == 0.0


def _scripted_generation(policy: ev.ScriptedPolicy):
  """``run_episodes``' re-reading policy that answers as ``policy`` does."""

  def generate(prompts, max_new):
    tokens = []
    for p in prompts:
      ids = policy.vocab.encode(policy.reply(policy.text(p)))
      tokens.append(ids[:max_new] + ([policy.vocab.eos_id] if len(ids) < max_new else []))
    return Generation(tokens, [[0.0] * len(t) for t in tokens], [True] * len(tokens))
  return generate


@pytest.mark.parametrize("reply", [_solver, lambda text: WRONG, lambda text: "x" * 400])
def test_plays_are_the_self_play_episodes(chat, pool, reply):
  cfg = ev.suite_config("families", {"families": "guess_number:3,arithmetic_chain:4",
                                     "seeds": 2})
  plays = fam_eval.play(ev.ScriptedPolicy(chat.vocab, reply), chat, cfg, pool)
  assert len(plays) == 4
  for family, level in cfg.items():
    fam = FAMILIES[family]
    episodes = run_episodes(
        pool, [fam.program_at(level)], [EpisodeSpec(0, s) for s in cfg.seed_list()],
        _scripted_generation(ev.ScriptedPolicy(chat.vocab, reply)), chat,
        agent_system_prompt("games"), max_turns=fam.max_turns(**fam.levels(level)),
        max_turn_tokens=cfg.max_new_tokens, max_len=cfg.max_len)
    mine = [p for p in plays if (p.family, p.level) == (family, level)]
    for p, ep in zip(mine, episodes, strict=True):
      assert p.tokens == ep.tokens
      assert (p.outcome, p.turns, p.reward) == (ep.outcome, ep.turns, ep.reward)


@pytest.mark.parametrize("spec, match", [
    ("guess_number:3,nope:1", r"families\.families: unknown env family 'nope'"),
    ("guess_number:4-2", r"families\.families: 'guess_number:4-2' has an empty level range"),
    ("guess_number:5", r"families\.families: 'guess_number:5' has level '5'; expected 0\.\.4"),
    ("guess_number:hardish", r"families\.families: .* has level 'hardish'"),
    ("guess_number:3,guess_number:2-3", r"families\.families: guess_number level 3 is given "
                                        "twice"),
    (",", r"families\.families=',' names no family"),
])
def test_bad_items_name_the_field(spec, match):
  with pytest.raises(ValueError, match=match):
    ev.suite_config("families", {"families": spec})
  with pytest.raises(ValueError, match=match):
    ev.EvalConfig(suites="families", overrides={"families": {"families": spec}}).suite_configs()


def test_eval_config_knobs_reach_the_suite():
  cfg = ev.EvalConfig(suites="families", limit=2, samples=3, max_new_tokens=16,
                      batch_size=4, seed=7,
                      overrides={"families": {"families": ["guess_number:3", "ordering"]}}
                      ).suite_configs()["families"]
  assert (cfg.limit, cfg.samples, cfg.max_new_tokens, cfg.batch_size, cfg.seed) == (
      2, 3, 16, 4, 7)
  assert cfg.families == "guess_number:3,ordering" and len(cfg.items()) == 6
  assert cfg.seed_list() == [10_000, 10_001]
  with pytest.raises(ValueError, match=r"families\.seeds=0"):
    ev.suite_config("families", {"seeds": 0})


def test_a_tiny_model_plays_as_self_play_does(chat, pool):
  vocab = chat.vocab
  model = models.get_preset("tiny", vocab_size=4096)
  rule = sampling.SamplingConfig(temperature=0.0, eos_id=vocab.eos_id, pad_id=vocab.pad_id)
  policy = sampling.Sampler(models.init_params(jax.random.key(0), model), model, rule,
                            jax.random.key(0), detokenize=vocab.decode)
  cfg = {"families": f"{HELD_OUT}:0", "seeds": 1, "max_new_tokens": 6, "max_len": 1024}
  result = ev.evaluate(policy, chat, ["families"], {"families": cfg}, pool=pool)["families"]
  [record] = result.records
  assert record["outcome"] in ("terminated", "max_turns", "context", "solved"), record
  assert record["turns"] >= 1 and all(0.0 <= v <= 1.0 for v in result.scores.values())
  # Greedy: the same tokens as the self-play episode runner on the same engine.
  [p] = fam_eval.play(policy, chat, ev.suite_config("families", cfg), pool)
  fam = FAMILIES[HELD_OUT]
  [ep] = run_episodes(pool, [fam.program_at(0)], [EpisodeSpec(0, 10_000)], policy, chat,
                      agent_system_prompt("games"), max_turns=fam.max_turns(**fam.levels(0)),
                      max_turn_tokens=6, max_len=1024)
  assert p.tokens == ep.tokens and (p.outcome, p.turns) == (ep.outcome, ep.turns)
