"""Episode runner: KV-cache continuation equals re-reading the transcript; slot refill
keeps every episode's transcript; transcripts and log-probs are what the sampler saw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import ChatTemplate, get_preset, init_params, token_logprobs
from spade_jax.sampling import Request, Sampler, SamplingConfig
from spade_jax.sampling.rules import row_keys
from spade_jax.sandbox.pool import CallResult
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes, run_episodes_with_requests

CFG = get_preset("tiny")


class _Bytes:
  """Byte ids offset by 3 (0 pad, 1 EOS), like the tiny preset's vocabulary."""

  eos_id, pad_id = 1, 0

  def encode(self, text):
    return [b + 3 for b in text.encode()]

  def decode(self, ids):
    out = []
    for i in ids:
      if i == 1:
        break
      if i >= 3:
        out.append(i - 3)
    return bytes(out).decode(errors="replace")


class _FakePool:
  """Env e: observations of length depending on the turn; ends after 2 + seed % 3 turns."""

  def start(self, sources, max_turns=25, class_names=None, action_mode="auto", kwargs=None):
    assert action_mode in ("auto", "raw")
    return [{"turn": 0, "seed": None} for _ in sources]

  def reset_many(self, handles, seeds):
    for h, s in zip(handles, seeds):
      h["seed"], h["turn"] = s, 0
    return [CallResult(True, (f"go{s}", {})) for s in seeds]

  def step_many(self, handles, actions):
    out = []
    for h, a in zip(handles, actions):
      h["turn"] += 1
      end = h["turn"] >= 2 + h["seed"] % 3
      out.append(CallResult(True, ("x" * (1 + (h["seed"] + h["turn"]) % 4),
                                   0.5 if end else 0.0, end, False, {})))
    return out

  def release(self, handles):
    pass


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _play(policy, specs, **kw):
  chat = ChatTemplate(_Bytes())
  return run_episodes(_FakePool(), ["src"], specs, policy, chat, "s",
                      max_turns=4, max_turn_tokens=6, max_len=200, **kw)


SPECS = [EpisodeSpec(0, s) for s in (0, 1, 2, 4, 5)]


def test_cached_turns_equal_rereading_and_match_full_forward(params):
  rule = SamplingConfig(temperature=0.0, eos_id=1, pad_id=0)
  sampler = Sampler(params, CFG, rule, jax.random.key(1))
  cached = _play(sampler, SPECS)
  reread = _play(lambda prompts, n: sampler(prompts, n), SPECS)
  for a, b in zip(cached, reread):
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert a.turns == b.turns and a.outcome == b.outcome
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)
  width = 200
  for ep in cached:
    n = len(ep.tokens)
    t = jnp.array([ep.tokens + [0] * (width - n)])
    seg = jnp.array([[1] * n + [0] * (width - n)])
    ref = np.asarray(token_logprobs(params, CFG, t, jnp.arange(width)[None], seg))[0, :n]
    m = np.array(ep.loss_mask)
    np.testing.assert_allclose(np.array(ep.logps)[m], ref[m], atol=1e-4)
    if ep.outcome != "context":
      assert ep.turns == min(4, 2 + ep.spec.seed % 3)
  assert {ep.outcome for ep in cached} >= {"terminated", "context"}


def test_one_turn_episodes_size_the_cache_to_prompt_and_turn(params):
  # One turn: the engine's rows are cut from max_len (400) to the power of two above the
  # longest prompt plus the turn budget, with the transcripts of rereading.
  rule = SamplingConfig(temperature=0.0, eos_id=1, pad_id=0)
  sampler = Sampler(params, CFG, rule, jax.random.key(1))
  sizes = []
  real = sampler.engine
  sampler.engine = lambda slots, max_len, **kw: sizes.append(max_len) or real(slots, max_len,
                                                                                **kw)
  chat = ChatTemplate(_Bytes())
  play = lambda policy: run_episodes(_FakePool(), ["src"], SPECS, policy, chat, "s",
                                     max_turns=1, max_turn_tokens=6, max_len=400)
  cached = play(sampler)
  reread = play(lambda prompts, n: sampler(prompts, n))
  longest = max(ep.loss_mask.index(True) for ep in cached) + 6
  assert len(sizes) == 1 and longest <= sizes[0] < max(2 * longest, 64) < 400, (sizes,
                                                                                longest)
  for a, b in zip(cached, reread):
    assert a.tokens == b.tokens and a.turns == b.turns == 1
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)


def test_slot_refill_keeps_each_episode(params):
  rule = SamplingConfig(temperature=1.0, eos_id=1, pad_id=0)
  full = _play(Sampler(params, CFG, rule, jax.random.key(2)), SPECS)
  two = _play(Sampler(params, CFG, rule, jax.random.key(2)), SPECS, max_slots=2)
  for a, b in zip(full, two):
    assert a.tokens == b.tokens and a.turns == b.turns and a.outcome == b.outcome
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)


class _ShapedPool(_FakePool):
  """Pays 0.3 on every step; seed 0 truncates after 3 turns, seed 1 terminates with 0.5."""

  def step_many(self, handles, actions):
    out = []
    for h in handles:
      h["turn"] += 1
      last = h["turn"] >= 3
      end = (0.5, last, False) if h["seed"] == 1 else (0.3, False, last)
      out.append(CallResult(True, ("obs", end[0] if last else 0.3, end[1], end[2], {})))
    return out


def test_only_the_terminal_reward_counts(params):
  chat = ChatTemplate(_Bytes())
  sampler = Sampler(params, CFG, SamplingConfig(temperature=0.0, eos_id=1, pad_id=0),
                    jax.random.key(1))
  eps = run_episodes(_ShapedPool(), ["src"], [EpisodeSpec(0, 0), EpisodeSpec(0, 1)],
                     sampler, chat, None, max_turns=4, max_turn_tokens=4, max_len=400)
  assert [e.outcome for e in eps] == ["truncated", "terminated"]
  assert [e.reward for e in eps] == [0.0, 0.5]  # intermediate 0.3s never count


def test_hint_is_appended_to_the_first_observation(params):
  chat = ChatTemplate(_Bytes())
  sampler = Sampler(params, CFG, SamplingConfig(temperature=0.0, eos_id=1, pad_id=0),
                    jax.random.key(1))
  plain, hinted = run_episodes(
      _FakePool(), ["src"], [EpisodeSpec(0, 2), EpisodeSpec(0, 2, True, "try 7")], sampler,
      chat, "sys", max_turns=1, max_turn_tokens=4, max_len=400)
  first = lambda ep: chat.vocab.decode(ep.tokens[:ep.loss_mask.index(True)])
  assert "go2" in first(plain) and "try 7" not in first(plain)
  assert first(hinted).index("go2") < first(hinted).index("try 7")
  assert "try 7" not in first(hinted).split("<|im_end|>")[0]  # not in the system turn


@pytest.mark.parametrize("max_slots,overlap", [(None, True), (2, True), (None, 2),
                                               (3, 2), (None, 3)])
def test_overlapped_rollout_equals_lock_step(params, max_slots, overlap):
  # Several stop ids make turn lengths differ, so turns end at different steps. An int
  # overlap runs that many out-of-phase cohorts of rows.
  rule = SamplingConfig(temperature=1.0, eos_id=1, eos_ids=tuple(range(3, 40)), pad_id=0)
  lock = _play(Sampler(params, CFG, rule, jax.random.key(5)), SPECS, max_slots=max_slots)
  over = _play(Sampler(params, CFG, rule, jax.random.key(5)), SPECS, max_slots=max_slots,
               overlap=overlap)
  assert len({len(t) for ep in lock for t in [ep.tokens]}) > 1
  for a, b in zip(lock, over):
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert (a.turns, a.outcome, a.reward) == (b.turns, b.outcome, b.reward)
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)


@pytest.mark.parametrize("max_slots,overlap", [(None, False), (3, False), (None, True),
                                               (None, 2)])
def test_requests_decode_beside_the_episodes(params, max_slots, overlap):
  # One-shot requests (the next regeneration's designer programs) ride on the episodes'
  # engine rows: the episodes' transcripts are unchanged and each request's output is
  # the row `generate` draws with the same key and parameters.
  rule = SamplingConfig(temperature=1.0, eos_id=1, eos_ids=(3, 4, 5), pad_id=0)
  prompts = [[5 + i] * (3 + 7 * i) for i in range(3)]
  alone = _play(Sampler(params, CFG, rule, jax.random.key(5)), SPECS)
  designer = Sampler(params, CFG, rule, jax.random.key(9))
  ref = designer(prompts, 40)
  key = jax.random.fold_in(jax.random.key(9), 0)  # the designer's call 0, as `ref` drew
  requests = [Request(p, 40, k) for p, k in zip(prompts, row_keys(key, len(prompts)))]
  eps, done = run_episodes_with_requests(
      _FakePool(), ["src"], SPECS, Sampler(params, CFG, rule, jax.random.key(5)),
      ChatTemplate(_Bytes()), "s", requests, max_turns=4, max_turn_tokens=6, max_len=200,
      max_slots=max_slots, overlap=overlap)
  for a, b in zip(alone, eps):
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert (a.turns, a.outcome, a.reward) == (b.turns, b.outcome, b.reward)
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)
  assert [c.tokens for c in done] == ref.tokens
  assert [c.finished for c in done] == ref.finished
  for c, lps in zip(done, ref.logprobs):
    np.testing.assert_allclose(c.logprobs, lps, atol=1e-5)
  assert max(map(len, ref.tokens)) > 6  # a request outlived the episodes' turns
  with pytest.raises(ValueError, match="empty prompt"):
    run_episodes_with_requests(_FakePool(), ["src"], SPECS, designer, ChatTemplate(_Bytes()),
                               "s", [Request([], 4, key)], max_turns=1, max_turn_tokens=4,
                               max_len=200)
