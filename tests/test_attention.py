"""Attention kernels chosen by name in ModelConfig: equal results, loud bad names."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import (ATTENTION, DECODE_ATTENTION, ModelConfig, decode_params,
                              decode_step, forward, get_preset, init_cache, init_params,
                              load_model_config, segment_mask)

CFG = get_preset("tiny")
B = 2


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _prefill(params, cfg, toks, S):
  """Logits [B, P, V] of a prefill into a fresh S-entry cache, and the cache."""
  P = toks.shape[1]
  pos = jnp.tile(jnp.arange(P), (B, 1))
  mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(P)[:, None], (B, P, S))
  return jax.jit(lambda p, c: forward(p, cfg, toks, pos, mask, c, 0))(
      params, init_cache(cfg, B, S, "float32"))


@pytest.mark.parametrize("name", list(ATTENTION))
def test_every_attention_kernel_matches_default(params, name):
  cfg = dataclasses.replace(CFG, attention=name)
  toks = jax.random.randint(jax.random.key(1), (B, 24), 3, CFG.vocab_size)
  pos = jnp.tile(jnp.arange(24), (B, 1))
  mask = segment_mask(jnp.ones_like(toks))
  want, _ = forward(params, CFG, toks, pos, mask)
  got, _ = forward(params, cfg, toks, pos, mask)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # With a cache (prefill / extend path).
  want, _ = _prefill(params, CFG, toks, 32)
  got, _ = _prefill(params, cfg, toks, 32)
  np.testing.assert_allclose(got, want, atol=1e-5)


# 512 entries: on CPU "auto" reads the cache whole, "blocks" walks two blocks.
@pytest.mark.parametrize("name", list(DECODE_ATTENTION))
def test_every_decode_attention_kernel_matches_default(params, name):
  cfg = dataclasses.replace(CFG, decode_attention=name)
  S, P, steps = 512, 300, 3
  toks = jax.random.randint(jax.random.key(2), (B, P + steps), 3, CFG.vocab_size)
  _, cache = _prefill(params, CFG, toks[:, :P], S)
  dp = decode_params(params, CFG)

  def run(c, feature_major):
    """Logits [steps, B, V] of `steps` decode steps under config c."""

    @jax.jit
    def step(kv, t):
      valid = jnp.broadcast_to(jnp.arange(S) <= t, (B, S))
      tok, pos = jax.lax.dynamic_index_in_dim(toks, t, 1, False), jnp.full((B,), t)
      if feature_major:
        return decode_step(dp, c, tok, pos, valid, kv, t, t + 1)
      logits, kv = forward(params, c, tok[:, None], pos[:, None], valid[:, None], kv, t,
                           live_len=t + 1)
      return logits[:, 0], kv

    kv, out = cache, []
    for t in range(P, P + steps):
      logits, kv = step(kv, jnp.int32(t))
      out.append(logits)
    return jnp.stack(out)

  for feature_major in (False, True):
    np.testing.assert_allclose(run(cfg, feature_major), run(CFG, feature_major), atol=1e-5)


def test_unknown_kernel_names_fail_at_config_construction():
  with pytest.raises(ValueError, match=r"Unknown attention implementation 'flash'; "
                     r"expected one of \['einsum', 'matmul'\]\. Set model\.attention"):
    ModelConfig(attention="flash")
  with pytest.raises(ValueError, match=r"Unknown decode attention implementation 'paged'; "
                     r"expected one of \['auto', 'blocks', 'dot'\]"):
    dataclasses.replace(CFG, decode_attention="paged")
  with pytest.raises(ValueError, match=r"Unknown remat policy 'some'"):
    ModelConfig(remat="some")


def test_model_config_json_without_kernel_fields_loads(tmp_path):
  values = dataclasses.asdict(dataclasses.replace(CFG, decode_attention="blocks"))
  (tmp_path / "model_config.json").write_text(json.dumps(values))
  assert load_model_config(str(tmp_path))[0].decode_attention == "blocks"
  for key in ("attention", "decode_attention"):
    values.pop(key)
  (tmp_path / "model_config.json").write_text(json.dumps(values))
  cfg, _ = load_model_config(str(tmp_path))
  assert (cfg.attention, cfg.decode_attention) == ("matmul", "auto")
