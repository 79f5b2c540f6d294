"""Greedy ids equal `transformers` generate (PyTorch CPU) on tiny random Qwen3,
Qwen3-MoE and Llama checkpoints imported with `spade_jax.models.load_hf`."""

import jax
import numpy as np
import pytest

from spade_jax.models import load_hf
from spade_jax.sampling import SamplingConfig, generate

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

NEW = 64
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=128,
              initializer_range=0.2, max_position_embeddings=256, rope_theta=1_000_000.0)
CASES = {
    "dense": (tf.Qwen3Config, dict(tie_word_embeddings=False)),
    "moe": (tf.Qwen3MoeConfig, dict(num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=32, norm_topk_prob=True,
                                    tie_word_embeddings=True)),
    "llama": (tf.LlamaConfig, dict(tie_word_embeddings=True)),
}


@pytest.mark.parametrize("case", ["dense", "llama", pytest.param("moe", marks=pytest.mark.slow)])
def test_greedy_ids_equal_transformers(case, tmp_path):
  cls, kw = CASES[case]
  torch.manual_seed(0)
  model = tf.AutoModelForCausalLM.from_config(cls(**COMMON, **kw), attn_implementation="eager")
  with torch.no_grad():  # non-trivial norm scales
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
  model.save_pretrained(str(tmp_path))
  model = model.eval().to(torch.float32)
  params, cfg = load_hf(str(tmp_path))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 256, n).tolist() for n in (5, 17, 11, 30)]
  ours = generate(params, cfg, prompts, SamplingConfig(temperature=0.0, eos_id=-1),
                  jax.random.key(0), NEW)
  for p, got in zip(prompts, ours.tokens):
    with torch.no_grad():
      out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(p):].tolist()
