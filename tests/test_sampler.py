"""Sampler: log-probs vs full forward, greedy, EOS stop, reproducibility, top-k/top-p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import get_preset, init_params, token_logprobs
from spade_jax.sampling import SamplingConfig, generate, sample_logits
from spade_jax.sampling.rules import TopK, TopP, first_argmax, token_logprob

CFG = get_preset("tiny")


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _full_logps(params, seq, width=64):
  """One full forward, padded to `width` so every call shares one program."""
  n = len(seq)
  t = jnp.array([list(seq) + [0] * (width - n)])
  seg = jnp.array([[1] * n + [0] * (width - n)])
  return np.asarray(token_logprobs(params, CFG, t, jnp.arange(width)[None], seg))[0, :n]


def test_logprobs_match_full_forward_with_ragged_prompts(params):
  prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40] * 20]
  g = generate(params, CFG, prompts, SamplingConfig(temperature=1.0, eos_id=-1),
               jax.random.key(1), 24)
  for p, toks, lps in zip(prompts, g.tokens, g.logprobs):
    assert len(toks) == 24
    ref = _full_logps(params, p + toks)[len(p):]
    np.testing.assert_allclose(lps, ref, atol=1e-4)


def test_greedy_equals_step_by_step_argmax(params):
  prompt = [20, 21, 22, 23]
  g = generate(params, CFG, [prompt], SamplingConfig(temperature=0.0, eos_id=-1),
               jax.random.key(0), 10)
  from spade_jax.models import forward, segment_mask
  width = 16
  step = jax.jit(lambda t, seg: forward(params, CFG, t, jnp.arange(width)[None],
                                        segment_mask(seg))[0])
  seq = list(prompt)
  for _ in range(10):
    n = len(seq)
    logits = step(jnp.array([seq + [0] * (width - n)]), jnp.array([[1] * n + [0] * (width - n)]))
    seq.append(int(jnp.argmax(logits[0, n - 1])))
  assert g.tokens[0] == seq[len(prompt):]


def test_eos_stops_row_and_fixed_key_is_reproducible(params):
  rule = SamplingConfig(temperature=1.0)
  prompts = [[30, 31, 32]] * 4
  a = generate(params, CFG, prompts, rule, jax.random.key(7), 64)
  b = generate(params, CFG, prompts, rule, jax.random.key(7), 64)
  assert a.tokens == b.tokens and a.logprobs == b.logprobs
  # Force EOS: a rule whose eos is the greedy first token.
  greedy = generate(params, CFG, [[30, 31, 32]], SamplingConfig(temperature=0.0, eos_id=-1),
                    jax.random.key(0), 3).tokens[0]
  g = generate(params, CFG, [[30, 31, 32], [33]], SamplingConfig(temperature=0.0, eos_id=greedy[0]),
               jax.random.key(0), 16)
  assert g.tokens[0] == greedy[:1] and g.finished[0]
  assert len(g.logprobs[0]) == 1


def test_top_k_and_top_p_match_truncated_distribution():
  probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
  logits = jnp.log(jnp.asarray(probs, jnp.float32))[None].repeat(4000, 0)
  keys = jax.random.key(3)
  k = np.asarray(sample_logits(logits, keys, SamplingConfig(top_k=3)))
  freq = np.bincount(k, minlength=6) / k.size
  want = np.r_[probs[:3] / probs[:3].sum(), 0, 0, 0]
  assert freq[3:].sum() == 0
  np.testing.assert_allclose(freq, want, atol=0.03)
  p = np.asarray(sample_logits(logits, jax.random.key(4), SamplingConfig(top_p=0.7)))
  freq = np.bincount(p, minlength=6) / p.size
  want = np.r_[probs[:3] / probs[:3].sum(), 0, 0, 0]  # 0.4+0.25 < 0.7 -> keeps 3
  assert freq[3:].sum() == 0
  np.testing.assert_allclose(freq, want, atol=0.03)


def _sorted_top_k(logits, k):
  kth = jax.lax.top_k(logits, k)[0][:, -1:]
  return jnp.where(logits < kth, -jnp.inf, logits)


def _sorted_top_p(logits, p):
  s = jnp.sort(logits, axis=-1)[:, ::-1]
  probs = jax.nn.softmax(s, axis=-1)
  keep = (jnp.cumsum(probs, axis=-1) - probs) < p
  threshold = jnp.min(jnp.where(keep, s, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < threshold, -jnp.inf, logits)


def test_sort_free_top_k_and_top_p_equal_the_sorted_definitions():
  # TopK / TopP find their thresholds by building an order key bit by bit; they keep
  # exactly the ids the sort-based definitions keep, ties, -inf and -0.0 included.
  rng = np.random.default_rng(0)
  for trial in range(60):
    V = int(rng.integers(2, 300))
    logits = rng.normal(size=(3, V)).astype(np.float32) * rng.uniform(0.1, 5)
    if trial % 3 == 0:
      logits = np.round(logits)  # many ties
    if trial % 5 == 0:
      logits[:, :V // 3] = -np.inf
    if trial % 7 == 0:
      logits[:, 0], logits[:, 1 % V] = -0.0, 0.0
    logits = jnp.asarray(logits)
    k, p = int(rng.integers(1, V + 1)), float(rng.uniform(0.05, 1.0))
    np.testing.assert_array_equal(TopK(k)(logits), _sorted_top_k(logits, k))
    np.testing.assert_array_equal(TopP(p)(logits), _sorted_top_p(logits, p))
    np.testing.assert_array_equal(TopP(p)(TopK(k)(logits)),
                                  _sorted_top_p(_sorted_top_k(logits, k), p))
  # p = 1 keeps every finite id; a one-hot row keeps only its peak.
  row = jnp.asarray([[0.0, -jnp.inf, 3.0, 1.0]])
  np.testing.assert_array_equal(TopP(1.0)(row), row)
  np.testing.assert_array_equal(TopP(0.5)(jnp.asarray([[0.0, 50.0, 1.0]])),
                                [[-np.inf, 50.0, -np.inf]])


def test_first_argmax_and_token_logprob_equal_jnp_argmax_and_log_softmax():
  rng = np.random.default_rng(1)
  argmax, pick = jax.jit(first_argmax), jax.jit(token_logprob)
  for trial in range(40):
    B, V = int(rng.integers(1, 9)), int(rng.integers(1, 700))
    x = rng.normal(size=(B, V)).astype(np.float32) * rng.uniform(0.1, 30)
    if trial % 3 == 0:
      x = np.round(x)  # ties: the first index wins
    if trial % 4 == 0:
      x[:, :V // 2] = -np.inf
    if trial % 5 == 0:
      x[0, :] = -np.inf  # a row with nothing finite
    if trial % 7 == 0:
      x[-1, V // 2] = np.nan  # NaN counts as the largest, as in jnp.argmax
    if trial % 11 == 0:
      x[0, 0], x[0, -1] = -0.0, 0.0
      x[0, 1:-1] = -1.0
    x = jnp.asarray(x)
    want = jnp.argmax(x, axis=-1)
    np.testing.assert_array_equal(argmax(x), want)
    np.testing.assert_array_equal(  # same arithmetic: equal to the bit, NaN where it is
        pick(x, want),
        jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), want[:, None], 1)[:, 0])
  assert argmax(jnp.zeros((2, 3, 5))).shape == (2, 3)


def test_bad_sampling_config():
  with pytest.raises(ValueError, match="top_p"):
    SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(temperature=-1)
