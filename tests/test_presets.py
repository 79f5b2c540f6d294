"""Every preset is planned with `jax.eval_shape` only; parameter counts match
the published totals, computed independently from HF config dimensions."""

import jax
import pytest

from spade_jax.models import PRESETS, config_to_hf, get_preset, init_params

# HF config.json dimensions of the published checkpoints, and their published
# total parameter counts (billions, as stated on the model cards).
HF = {
    "qwen3_0_6b": (dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8,
                        tie_word_embeddings=True), 0.6),
    "qwen3_1_7b": (dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8,
                        tie_word_embeddings=True), 1.7),
    "qwen3_4b": (dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8,
                      tie_word_embeddings=True), 4.0),
    "qwen3_8b": (dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8,
                      tie_word_embeddings=False), 8.2),
    "qwen3_14b": (dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=8,
                       tie_word_embeddings=False), 14.8),
    "qwen3_32b": (dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                       num_attention_heads=64, num_key_value_heads=8,
                       tie_word_embeddings=False), 32.8),
    "qwen3_30b_a3b": (dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                           num_attention_heads=32, num_key_value_heads=4,
                           num_experts=128, num_experts_per_tok=8,
                           moe_intermediate_size=768, tie_word_embeddings=False), 30.5),
}
HF["qwen3_4b_instruct_2507"] = (dict(HF["qwen3_4b"][0], rope_theta=5_000_000,
                                     max_position_embeddings=262144), 4.0)
HF["qwen3_30b_a3b_instruct_2507"] = (dict(HF["qwen3_30b_a3b"][0], rope_theta=10_000_000,
                                          max_position_embeddings=262144), 30.5)


def hf_count(c: dict) -> int:
  """Parameters of a Qwen3(-MoE) model from its HF config (all layers sparse)."""
  D, L, H, K, E, V = (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                      c["num_key_value_heads"], 128, 151936)
  attn = D * H * E + 2 * D * K * E + H * E * D + 2 * E + 2 * D
  if c.get("num_experts"):
    mlp = c["num_experts"] * 3 * D * c["moe_intermediate_size"] + D * c["num_experts"]
  else:
    mlp = 3 * D * c["intermediate_size"]
  emb = V * D * (1 if c["tie_word_embeddings"] else 2)
  return L * (attn + mlp) + emb + D


def _count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", sorted(HF))
def test_published_preset_parameter_counts(name):
  cfg = get_preset(name)
  shapes = jax.eval_shape(lambda k: init_params(k, cfg), jax.random.key(0))
  dims, published = HF[name]
  expected = hf_count(dims)
  assert _count(shapes) == expected
  assert abs(expected / 1e9 - published) < 0.05, (name, expected)
  exported = config_to_hf(cfg)
  for key, value in dims.items():
    if key == "rope_theta":
      assert exported["rope_parameters"]["rope_theta"] == value
    else:
      assert exported[key] == value, key


def test_every_preset_plans_and_aliases_resolve():
  for name, cfg in PRESETS.items():
    shapes = jax.eval_shape(lambda k, cfg=cfg: init_params(k, cfg), jax.random.key(0))
    assert _count(shapes) > 0, name
  assert get_preset("Qwen/Qwen3-30B-A3B-Instruct-2507") == PRESETS["qwen3_30b_a3b_instruct_2507"]
  assert get_preset("tiny").vocab_size == 259
  a3b = get_preset("qwen3_30b_a3b")
  active = (a3b.num_layers * (a3b.num_experts_per_tok * 3 * a3b.d_model * a3b.moe_mlp_dim))
  assert 3.0e9 < active + (_count(jax.eval_shape(lambda k: init_params(k, a3b), jax.random.key(0)))
                           - a3b.num_layers * a3b.num_experts * 3 * a3b.d_model * a3b.moe_mlp_dim) < 3.5e9
