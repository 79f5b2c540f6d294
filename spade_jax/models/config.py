"""Model hyperparameters and presets.

`ModelConfig` is frozen and hashable so it can be a static argument of jitted
functions. Presets are looked up by name with `get_preset`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Qwen3-shaped decoder hyperparameters.

  Attributes:
    vocab_size: number of token ids the embedding covers.
    d_model: residual width (HF `hidden_size`).
    num_layers: decoder layers (HF `num_hidden_layers`).
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention).
    head_dim: per-head width.
    mlp_dim: SwiGLU hidden width (HF `intermediate_size`).
    rope_theta: RoPE base frequency.
    rms_eps: RMSNorm epsilon.
    tie_embeddings: share the input embedding with the output projection.
    param_dtype: storage dtype of parameters.
    compute_dtype: dtype of activations and matmuls.
    remat: rematerialise each layer in the backward pass ("none" | "full").
  """

  vocab_size: int = 259
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  mlp_dim: int = 192
  rope_theta: float = 1_000_000.0
  rms_eps: float = 1e-6
  tie_embeddings: bool = True
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: str = "none"

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of "
          f"num_kv_heads={self.num_kv_heads} for grouped-query attention.")
    if self.remat not in ("none", "full"):
      raise ValueError(f"remat={self.remat!r}; expected 'none' or 'full'.")
    for name in ("param_dtype", "compute_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise ValueError(f"{name}={getattr(self, name)!r} is not a dtype name "
                         "(try 'float32' or 'bfloat16').") from e

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)


PRESETS: dict[str, ModelConfig] = {
    # Byte-level vocabulary (seqio.ByteVocabulary: 3 specials + 256 bytes).
    "tiny": ModelConfig(),
    "small": ModelConfig(d_model=256, num_layers=4, num_heads=8, num_kv_heads=4,
                         head_dim=32, mlp_dim=768),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  """Returns the preset `name`, with optional field overrides."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; valid presets: "
                     f"{sorted(PRESETS)}.")
  return dataclasses.replace(PRESETS[name], **overrides)
