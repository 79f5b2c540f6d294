"""The tool-use setting (docs/METHOD.md §5): harness, Qwen3 tool conversation, reset gate, judge."""

import dataclasses
import json
import types

import jax
import numpy as np
import pytest

from spade_jax import envs
from spade_jax.models import ChatTemplate, HFTokenizer, get_preset, init_params
from spade_jax.sampling import Generation, Sampler, SamplingConfig
from spade_jax.sandbox import EnvPool, SandboxConfig
from spade_jax.selfplay import SelfPlayConfig
from spade_jax.selfplay.stages import design as design_lib
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes

from experiments.configs import tiny

CFG = envs.ValidationConfig(setting="tool_use", max_turns=8, random_episodes=2, random_steps=3)
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def pool():
  with EnvPool(SandboxConfig(num_workers=2, call_timeout_s=3.0, load_timeout_s=20.0)) as p:
    yield p


@pytest.fixture(scope="module")
def chat():
  return ChatTemplate(HFTokenizer(tiny.TOKENIZER))


def _solution(pool, source, seed):
  h = envs.start(pool, [source], "tool_use", 8)[0]
  try:
    assert pool.reset_many([h], seeds=[seed])[0].ok
    return pool.call_many([h], "solution")[0].value
  finally:
    pool.release([h])


def _scripted(chat, turns):
  """A policy that plays `turns` in order, one per call (each ends the turn with EOS)."""
  state = {"t": 0}

  def policy(prompts, max_new):
    assert len(prompts) == 1
    text = turns[min(state["t"], len(turns) - 1)]
    state["t"] += 1
    toks = chat.vocab.encode(text) + [chat.vocab.eos_id]
    return Generation([toks], [[0.0] * len(toks)], [True])
  return policy


def _play(pool, chat, source, seed, turns, max_turns=8):
  return run_episodes(pool, [source], [EpisodeSpec(0, seed)], _scripted(chat, turns), chat,
                      SYSTEM, max_turns=max_turns, max_turn_tokens=512, max_len=6000,
                      setting="tool_use")[0]


@pytest.mark.parametrize("name", envs.programs.BUILTIN["tool_use"])
def test_builtin_tool_envs_are_valid_and_won_by_their_solution(pool, chat, name):
  source = envs.builtin_program(name)
  v = envs.validate_program(source, pool, CFG)
  assert v.valid, v.detail
  assert v.has_solution and v.has_hint and v.class_name.endswith("Env")
  for seed in (0, 7):
    turns = _solution(pool, source, seed)
    assert turns[-1] == "<answer>done</answer>"
    ep = _play(pool, chat, source, seed, turns)
    assert (ep.outcome, ep.reward, ep.malformed) == ("solved", 1.0, 0), (name, seed)
    text = chat.vocab.decode([t for t in ep.tokens if t != chat.vocab.eos_id])
    # Tools are declared in the system turn; results come back as tool responses.
    assert "# Tools" in text and "<tools>" in text and '"name": "' in text
    assert "<tool_response>" in text


def test_stopping_early_or_calling_a_wrong_tool_loses_and_malformed_calls_count(pool, chat):
  source = envs.builtin_program("library_loans")
  turns = _solution(pool, source, 3)
  early = _play(pool, chat, source, 3, [turns[0], "<answer>done</answer>"])
  assert (early.outcome, early.reward) == ("terminated", 0.0)
  wrong = ['<tool_call>{"name": "burn_books", "arguments": {}}</tool_call>',
           '<tool_call>{"name": "lend", "arguments": {"book_id": 1}</tool_call>',
           "<tool_call>not json</tool_call>", "<answer>done</answer>"]
  ep = _play(pool, chat, source, 3, wrong)
  assert (ep.outcome, ep.reward, ep.malformed) == ("terminated", 0.0, 3)
  text = chat.vocab.decode([t for t in ep.tokens if t != chat.vocab.eos_id])
  assert "unknown tool 'burn_books'" in text and "malformed tool call" in text


def test_several_calls_in_one_turn_and_the_next_request_is_revealed(pool, chat):
  source = envs.builtin_program("bank_transfers")
  turns = _solution(pool, source, 1)
  assert turns[0].count("<tool_call>") == 2  # unfreeze + transfer in one turn
  ep = _play(pool, chat, source, 1, turns[:1] + ["<answer>done</answer>"])
  text = chat.vocab.decode([t for t in ep.tokens if t != chat.vocab.eos_id])
  first_reply = text.split("<|im_start|>assistant", 2)[1]
  assert first_reply.count("<tool_response>") == 2
  assert "wants to move half" in first_reply  # the second request, as a user message


def test_cached_continuation_equals_rereading_for_tool_conversations(pool, chat):
  cfg = get_preset("tiny", vocab_size=4096)
  params = init_params(jax.random.key(0), cfg)
  rule = SamplingConfig(temperature=0.0, eos_id=chat.vocab.eos_id, pad_id=chat.vocab.pad_id)
  sampler = Sampler(params, cfg, rule, jax.random.key(1))
  source = envs.builtin_program("shop_orders")
  specs = [EpisodeSpec(0, s) for s in (0, 1)]
  kw = dict(max_turns=3, max_turn_tokens=12, max_len=3000, setting="tool_use")
  cached = run_episodes(pool, [source], specs, sampler, chat, SYSTEM, **kw)
  reread = run_episodes(pool, [source], specs, lambda p, n: sampler(p, n), chat, SYSTEM, **kw)
  for a, b in zip(cached, reread):
    assert a.tokens == b.tokens and a.outcome == b.outcome and a.turns == b.turns
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)


_BAD_BASE = envs.builtin_program("library_loans")


@pytest.mark.parametrize("change,reason", [
    # A criterion that raises on the reset state.
    (("lambda: b[self.want1][\"on_loan_to\"] == self.m1",
      "lambda: b[self.want1][\"due\"] == self.m1"), "reset_gate"),
    # Every criterion already holds at reset.
    (("lambda: b[self.want1][\"on_loan_to\"] == self.m1", "lambda: True"), None),
    # No tools declared.
    (("self.tools = [", "self.tools = [] and ["), "contract"),
])
def test_reset_gate_and_contract_reject_bad_tool_programs(pool, change, reason):
  source = _BAD_BASE.replace(*change)
  assert source != _BAD_BASE
  if reason is None:  # all pre-satisfied: make the other two hold at reset as well
    source = (source.replace('lambda: b[held]["on_loan_to"] is None', "lambda: True")
              .replace('lambda: b[self.want2]["on_loan_to"] == self.m2 and '
                       'b[held]["on_loan_to"] == self.m2', "lambda: True"))
    reason = "trivial"
  v = envs.validate_program(source, pool, CFG)
  assert v.reason == reason, v.detail
  if reason == "reset_gate":
    assert "criterion 1 raised KeyError" in v.detail


def test_a_game_style_program_is_not_a_tool_program(pool):
  v = envs.validate_program(envs.builtin_program("guess_secret"), pool, CFG)
  assert v.reason == "contract" and "tool_<name>" in v.detail


def test_the_judge_rejects_an_unreachable_criterion(pool):
  unreachable = _BAD_BASE.replace('lambda: b[held]["on_loan_to"] is None',
                                  'lambda: b[held]["on_loan_to"] == "nobody"')
  sound = envs.validate_program(_BAD_BASE, pool, CFG)
  bad = envs.validate_program(unreachable, pool, dataclasses.replace(CFG, require_solution=False))
  assert sound.valid
  # The solution replay cannot meet the unreachable criterion either.
  assert bad.reason == "infeasible"
  judged_programs = []

  def scripted_judge(prompts, max_new):
    texts = []
    for p in prompts:
      text = CHAT.vocab.decode(p)
      judged_programs.append(text)
      texts.append("\\boxed{no}" if '"nobody"' in text else "Looks fine. \\boxed{yes}")
    toks = [CHAT.vocab.encode(t) + [CHAT.vocab.eos_id] for t in texts]
    return Generation(toks, [[0.0] * len(t) for t in toks], [True] * len(toks))

  cfg = SelfPlayConfig(setting="tool_use", llm_validator=True)
  roles = types.SimpleNamespace(chat=CHAT, vocab=CHAT.vocab)  # what the judge reads of Roles
  roles_asked = []

  def policy(it, role):
    roles_asked.append((it, role))
    return scripted_judge

  no_solution = dataclasses.replace(bad, valid=True, reason=None)  # as if it had no witness
  out, judged = design_lib.judge(cfg, roles, policy, 0, 0, [sound, no_solution])
  assert out[0].valid and (out[1].valid, out[1].reason) == (False, "judge")
  assert "attempt 0" in out[1].detail and roles_asked == [(0, "hint")]
  assert judged == 2 and "\\boxed{yes}" in judged_programs[0]
  # Nothing valid: nothing to judge, the policy is not asked.
  assert design_lib.judge(cfg, roles, policy, 1, 1, [out[1]]) == ([out[1]], 0)
  assert roles_asked == [(0, "hint")]


CHAT = ChatTemplate(HFTokenizer(tiny.TOKENIZER))


def test_the_designer_prompt_samples_a_domain_and_task_type():
  from spade_jax.designer import designer_prompt  # pylint: disable=g-import-not-at-top
  p = designer_prompt("tool_use", "tool selection", domain=envs.TOOL_DOMAINS[4],
                      task_type="irrelevant request")
  assert f"Domain: {envs.TOOL_DOMAINS[4]}. Task type: irrelevant request" in p
  assert len(envs.TOOL_DOMAINS) == 10 and len(envs.TOOL_TASK_TYPES) == 4
  with pytest.raises(ValueError, match="domains"):
    designer_prompt("tool_use", "tool selection", domain="space travel")
  assert json.loads(json.dumps(envs.TOOL_DOMAINS))


def test_gym_adapter_and_check_env_accept_tool_programs(pool, tmp_path):
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  from gymnasium.utils.env_checker import check_env  # pylint: disable=g-import-not-at-top
  source = envs.builtin_program("calendar_meetings")
  env = envs.ProgramEnv(source, max_turns=8, pool=pool, setting="tool_use")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    check_env(env, skip_render_check=True)
  obs, info = env.reset(seed=0)
  assert "Book 'sync'" in obs and {t["name"] for t in info["tools"]} >= {"book", "cancel"}
  obs, reward, term, trunc, info = env.step("What hour works?")
  assert info["user"] and not term
  env.close()
  path = tmp_path / "calendar.py"
  path.write_text(source)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-m", "launch.check_env", str(path), "--json"],
                       cwd=repo, capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads(out.stdout)
  assert report["valid"] and report["episodes"][0]["solved"]
