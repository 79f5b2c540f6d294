"""Llama (`ModelConfig.qk_norm=False`) against `transformers.LlamaForCausalLM`.

Tiny random Llama checkpoints (tied and untied) are saved with `save_pretrained` and
imported with `load_hf`: fp32 logits, greedy ids from the library sampler, the export
round trip, and the feature-major decode step against `forward`. The SmolLM2 preset's
parameter count is checked against the published model's.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import models
from spade_jax.models import hf
from spade_jax.sampling import SamplingConfig, generate

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

V = 256
COMMON = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=128,
              initializer_range=0.2, max_position_embeddings=256, rms_norm_eps=1e-5,
              rope_theta=100_000.0)
CASES = {"tied": dict(tie_word_embeddings=True), "untied": dict(tie_word_embeddings=False)}


def _build(directory, kw):
  torch.manual_seed(0)
  model = tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, **kw))
  with torch.no_grad():  # non-trivial norm scales
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
  model.save_pretrained(directory)
  return model.eval().to(torch.float32)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp("llama")
  return {name: (str(root / name), _build(str(root / name), kw)) for name, kw in CASES.items()}


def _batch():
  rng = np.random.RandomState(0)
  B, T = 3, 12
  toks = rng.randint(0, V, (B, T))
  valid = np.zeros((B, T), bool)
  for b, n in enumerate([12, 7, 3]):
    valid[b, T - n:] = True  # left padding
  toks[~valid] = 0
  return toks, valid, np.maximum(np.cumsum(valid, 1) - 1, 0)


def _hf_logits(model, toks, valid, pos):
  with torch.no_grad():
    return model(input_ids=torch.tensor(toks),
                 attention_mask=torch.tensor(valid.astype(np.int64)),
                 position_ids=torch.tensor(pos)).logits.float().numpy()


def _ours(params, cfg, toks, valid, pos):
  T = toks.shape[1]
  mask = np.tril(np.ones((T, T), bool))[None] & valid[:, None, :]
  out, _ = jax.jit(models.forward, static_argnums=1)(params, cfg, jnp.asarray(toks),
                                                     jnp.asarray(pos), jnp.asarray(mask))
  return np.asarray(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_logits_match_transformers(checkpoints, case):
  directory, model = checkpoints[case]
  params, cfg = hf.load_hf(directory)
  assert not cfg.qk_norm and cfg.tie_embeddings == (case == "tied")
  assert "q_norm" not in params["layers"] and ("lm_head" in params) == (case == "untied")
  toks, valid, pos = _batch()
  err = np.abs(_ours(params, cfg, toks, valid, pos) - _hf_logits(model, toks, valid, pos))
  assert err[valid].max() < 1e-4, f"{case}: max abs logit error {err[valid].max()}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_ids_equal_transformers(checkpoints, case):
  directory, model = checkpoints[case]
  params, cfg = hf.load_hf(directory)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, V, n).tolist() for n in (5, 17, 11)]
  new = 16
  ours = generate(params, cfg, prompts, SamplingConfig(temperature=0.0, eos_id=-1),
                  jax.random.key(0), new)
  for p, got in zip(prompts, ours.tokens):
    with torch.no_grad():
      out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(p):].tolist()


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_round_trip_is_bit_exact(checkpoints, case, tmp_path):
  directory, model = checkpoints[case]
  params, cfg = hf.load_hf(directory)
  hf.save_hf(str(tmp_path), params, cfg, base_config=hf.read_hf_config(directory))
  written = json.load(open(tmp_path / "config.json"))
  assert written["model_type"] == "llama" and written["architectures"] == ["LlamaForCausalLM"]
  assert "layer_types" not in written and "use_sliding_window" not in written
  back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert type(back).__name__ == "LlamaForCausalLM"
  toks, valid, pos = _batch()
  np.testing.assert_array_equal(_hf_logits(back, toks, valid, pos),
                                _hf_logits(model, toks, valid, pos))
  again, cfg2 = hf.load_hf(str(tmp_path))
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, again, params)
  # Without a base config (a fresh model) the export is a Llama config too.
  hf.save_hf(str(tmp_path / "bare"), params, cfg)
  assert tf.AutoConfig.from_pretrained(str(tmp_path / "bare")).model_type == "llama"


def test_feature_major_decode_step_matches_forward():
  cfg = dataclasses.replace(models.get_preset("tiny"), qk_norm=False)
  p = models.init_params(jax.random.key(4), cfg)
  assert "q_norm" not in p["layers"] and "q_norm" not in models.param_axes(cfg)["layers"]
  dp = models.decode_params(p, cfg)
  assert sorted(dp["layers"][0]) == ["attn_norm", "mlp_norm", "o", "qkv"]
  B, P, S = 3, 6, 16
  toks = jax.random.randint(jax.random.key(5), (B, P + 4), 3, 259)
  pos = jnp.tile(jnp.arange(P + 4), (B, 1))
  m = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(P)[:, None], (B, P, S))
  _, cache = models.forward(p, cfg, toks[:, :P], pos[:, :P], m,
                            models.init_cache(cfg, B, S, "float32"), 0)
  ref_cache = cache
  step = jax.jit(lambda dp, c, t, ps, v, i: models.decode_step(dp, cfg, t, ps, v, c, i, i + 1))
  for t in range(P, P + 4):
    valid = jnp.broadcast_to(jnp.arange(S) <= t, (B, S))
    want, ref_cache = models.forward(p, cfg, toks[:, t:t + 1], pos[:, t:t + 1],
                                     valid[:, None], ref_cache, t, live_len=t + 1)
    got, cache = step(dp, cache, toks[:, t], pos[:, t], valid, jnp.int32(t))
    np.testing.assert_allclose(got, want[:, 0], atol=2e-5)


def test_config_errors_name_the_key(checkpoints):
  base = hf.read_hf_config(checkpoints["tied"][0])
  with pytest.raises(ValueError, match="mlp_bias=True is not supported"):
    hf.config_from_hf({**base, "mlp_bias": True})
  with pytest.raises(ValueError, match="attention_bias=True is not supported"):
    hf.config_from_hf({**base, "attention_bias": True})
  llama3 = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}
  with pytest.raises(ValueError, match="rope_type='llama3'.*Llama-3 style"):
    hf.config_from_hf({**base, "rope_parameters": llama3})
  with pytest.raises(ValueError, match="rope_scaling=.*Llama-3 style"):
    hf.config_from_hf({**base, "rope_scaling": llama3})
  moe = dataclasses.replace(models.get_preset("tiny_moe"), qk_norm=False)
  with pytest.raises(ValueError, match="qk_norm=False and num_experts=8"):
    hf.config_to_hf(moe)


def test_smollm2_preset_matches_the_published_model():
  cfg = models.get_preset("HuggingFaceTB/SmolLM2-135M-Instruct")
  assert cfg == models.PRESETS["smollm2_135m_instruct"]
  assert models.num_params(cfg) == 134_515_008  # the published count
  exported = hf.config_to_hf(cfg)
  assert exported["model_type"] == "llama" and exported["head_dim"] == 64
  assert exported["num_key_value_heads"] == 3 and exported["tie_word_embeddings"]
  assert hf.config_from_hf(exported) == cfg
