"""Model sizes, prompts and recipe sections shared by the CPU benchmarks."""

from __future__ import annotations

from absl import app

# Random Qwen3 sizes in `ModelConfig` field names. "50m": ~50M parameters with
# a 32k vocabulary.
SIZES = {
    "tiny": dict(vocab_size=512, d_model=256, num_layers=4, num_heads=8, num_kv_heads=4,
                 head_dim=32, mlp_dim=768),
    # The first mechanism experiment's model (experiments/mechanism/results/first), ~10.6M.
    "mechanism": dict(vocab_size=6144, d_model=320, num_layers=8, num_heads=5, num_kv_heads=1,
                      head_dim=64, mlp_dim=864),
    "50m": dict(vocab_size=32768, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4,
                head_dim=64, mlp_dim=1536),
}
# `ModelConfig` field -> HF `Qwen3Config` field, where they differ.
_HF_NAMES = {"d_model": "hidden_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
             "mlp_dim": "intermediate_size"}


def _size(size: str) -> dict:
  if size not in SIZES:
    raise app.UsageError(f"--models: unknown size {size!r}; expected one of {sorted(SIZES)}.")
  return SIZES[size]


def hf_fields(size: str) -> dict:
  """The size in HF `Qwen3Config` field names."""
  return {_HF_NAMES.get(k, k): v for k, v in _size(size).items()}


def model_config(size: str):
  """`ModelConfig` of the size: untied head, layers unrolled."""
  from spade_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig(**_size(size), tie_embeddings=False, scan_layers=False)


def uneven_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
  """`batch` random prompts: the first `length` ids, the others half to full length."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  lens = [length] + [int(rng.integers(length // 2, length + 1)) for _ in range(batch - 1)]
  return [rng.integers(1, vocab - 1, n).tolist() for n in lens]


def recipe_sections():
  """The learning recipe's model / train / loss / optimizer configs (no weights) and its
  mesh rules' name."""
  from experiments.configs import learn  # pylint: disable=g-import-not-at-top
  from spade_jax import rl  # pylint: disable=g-import-not-at-top
  from spade_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  c = learn.get_config("")
  model = ModelConfig(**{k: v for k, v in c.model.items() if k != "init_from"})
  return (model, rl.TrainConfig(**c.train), rl.LossConfig(**c.loss),
          rl.OptimizerConfig(**c.optimizer), c.mesh.rules)
