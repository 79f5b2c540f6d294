"""Sampler: log-probs vs full forward, greedy, EOS stop, reproducibility, top-k/top-p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import get_preset, init_params, token_logprobs
from spade_jax.sampling import SamplingConfig, generate, sample_logits

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


def test_bad_sampling_config():
  with pytest.raises(ValueError, match="top_p"):
    SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(temperature=-1)
