"""Hugging Face Qwen3 / Qwen3-MoE / Llama checkpoints: config mapping, import, export.

`model_type` "llama" (LlamaForCausalLM) imports as `ModelConfig(qk_norm=False)`;
a config without q/k norm exports as "llama", one with it as "qwen3" / "qwen3_moe"
(the field decides the family, so no separate family name is stored). Llama
tensors are named as Qwen3's, less `q_norm` / `k_norm`.

Import streams: every parameter is assembled shard by shard straight from the
memory-mapped safetensors files into its target sharding, so the host never
holds a second full copy of the model (at most one device shard at a time).
Export writes `config.json` plus safetensors in the layout `transformers`
saves (per-expert MoE weights), one tensor at a time.

HF layouts (torch Linear stores [out, in]) against ours:
  q_proj [H*E, D] -> q [D, H, E];   o_proj [D, H*E] -> o [H, E, D]
  gate_proj/up_proj [F, D] -> [D, F];  down_proj [D, F] -> [F, D]
  mlp.gate (router) [X, D] -> [D, X];  lm_head [V, D] as is
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

from absl import logging
import jax
import numpy as np

from spade_jax.models import tensorfile
from spade_jax.models.config import ModelConfig
from spade_jax.models.qwen3 import Params, param_shapes

MODEL_TYPES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "llama": "LlamaForCausalLM"}
# Config keys that carry no model math (or only metadata we do not need).
_IGNORED_KEYS = {
    "architectures", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "attention_dropout", "output_router_logits", "router_aux_loss_coef",
    "max_window_layers", "sliding_window", "model_type", "num_local_experts",
    "layer_types", "rope_scaling", "rope_parameters", "rope_theta", "use_sliding_window",
    "attention_bias", "hidden_act", "tie_word_embeddings", "_name_or_path",
    "partial_rotary_factor", "mlp_bias", "pretraining_tp",
}
# Keys of one family's config.json that the other family's has not.
_QWEN3_ONLY = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
_LLAMA_ONLY = ("mlp_bias", "pretraining_tp")
_FIELDS = {  # HF key -> ModelConfig field
    "vocab_size": "vocab_size", "hidden_size": "d_model",
    "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
    "intermediate_size": "mlp_dim", "rms_norm_eps": "rms_eps",
    "max_position_embeddings": "max_position_embeddings",
    "num_experts": "num_experts", "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "moe_mlp_dim", "norm_topk_prob": "norm_topk_prob",
    "decoder_sparse_step": "decoder_sparse_step", "mlp_only_layers": "mlp_only_layers",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json",
                   "merges.txt", "generation_config.json", "special_tokens_map.json")


def read_hf_config(directory: str) -> dict[str, Any]:
  """Loads `<directory>/config.json`, naming the file when it is missing or broken."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path!r} does not exist: a Hugging Face checkpoint "
                            "directory needs config.json next to its safetensors.")
  with open(path) as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError(f"{path!r} is not valid JSON: {e}") from e


def config_from_hf(hf: dict[str, Any], where: str = "config.json",
                   **overrides) -> ModelConfig:
  """ModelConfig from an HF config dict; unsupported settings raise, naming the key."""
  mt = hf.get("model_type")
  if mt not in MODEL_TYPES:
    raise ValueError(f"{where}: model_type={mt!r} is not supported; expected one of "
                     f"{sorted(MODEL_TYPES)} (Qwen3 dense or MoE, Llama).")

  def unsupported(key, value, expected):
    raise ValueError(f"{where}: {key}={value!r} is not supported (expected {expected}).")

  unknown = sorted(set(hf) - set(_FIELDS) - _IGNORED_KEYS)
  if unknown:
    raise ValueError(f"{where}: unsupported config key(s) {unknown}; this loader "
                     f"understands {sorted(set(_FIELDS) | _IGNORED_KEYS)}. Remove the "
                     "key(s) if they do not change the model.")
  if hf.get("attention_bias", False):
    unsupported("attention_bias", True, "false")
  if hf.get("mlp_bias", False):
    unsupported("mlp_bias", True, "false")
  if hf.get("hidden_act", "silu") != "silu":
    unsupported("hidden_act", hf["hidden_act"], "'silu'")
  if hf.get("use_sliding_window", False):
    unsupported("use_sliding_window", True, "false")
  if any(t != "full_attention" for t in hf.get("layer_types") or []):
    unsupported("layer_types", hf["layer_types"], "all 'full_attention'")
  rope = hf.get("rope_parameters") or {}
  if hf.get("rope_scaling"):
    unsupported("rope_scaling", hf["rope_scaling"],
                "null (plain RoPE; Llama-3 style scaled RoPE is not implemented)")
  if rope.get("rope_type", "default") != "default":
    unsupported("rope_parameters.rope_type", rope["rope_type"],
                "'default' (plain RoPE; Llama-3 style scaled RoPE is not implemented)")
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  kw: dict[str, Any] = {}
  for key, field in _FIELDS.items():
    if key in hf and hf[key] is not None:
      kw[field] = hf[key]
  if "num_experts" not in kw and hf.get("num_local_experts"):
    kw["num_experts"] = hf["num_local_experts"]
  if mt in ("qwen3", "llama"):
    for key in ("num_experts", "num_experts_per_tok", "moe_mlp_dim", "norm_topk_prob",
                "decoder_sparse_step", "mlp_only_layers"):
      kw.pop(key, None)
  if "head_dim" not in kw:
    kw["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
  kw["mlp_only_layers"] = tuple(kw.get("mlp_only_layers") or ())
  kw["rope_theta"] = float(theta)
  kw["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
  kw["qk_norm"] = mt != "llama"
  return ModelConfig(**{**kw, **overrides})


def hf_model_type(cfg: ModelConfig) -> str:
  """The HF `model_type` that holds `cfg`: "qwen3", "qwen3_moe" or "llama"."""
  moe = cfg.num_experts > 0
  if cfg.qk_norm:
    return "qwen3_moe" if moe else "qwen3"
  if moe:
    raise ValueError(f"A config with qk_norm=False and num_experts={cfg.num_experts} has "
                     "no Hugging Face model type here (Llama is dense, Qwen3-MoE has q/k "
                     "norm); set num_experts=0 or qk_norm=True to export it.")
  return "llama"


def config_to_hf(cfg: ModelConfig, base: dict[str, Any] | None = None) -> dict[str, Any]:
  """HF config dict for `cfg`; `base` (the imported config.json) keeps its metadata."""
  moe = cfg.num_experts > 0
  mt = hf_model_type(cfg)
  hf = dict(base or {})
  for key in ("rope_scaling", "num_local_experts", "rope_theta") + (
      _QWEN3_ONLY if mt == "llama" else _LLAMA_ONLY):
    hf.pop(key, None)
  hf.update({
      "architectures": [MODEL_TYPES[mt]], "model_type": mt,
      "attention_bias": False, "hidden_act": "silu",
      "tie_word_embeddings": cfg.tie_embeddings,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "dtype": cfg.param_dtype,
  })
  if mt == "llama":
    hf.update({"mlp_bias": False, "pretraining_tp": 1})
  else:
    hf.update({"use_sliding_window": False, "sliding_window": None})
  for key, field in _FIELDS.items():
    value = getattr(cfg, field)
    if not moe and field in ("num_experts", "num_experts_per_tok", "moe_mlp_dim",
                             "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
      hf.pop(key, None)
      continue
    hf[key] = list(value) if isinstance(value, tuple) else value
  if mt == "qwen3":
    hf["layer_types"] = ["full_attention"] * cfg.num_layers
  else:
    hf.pop("layer_types", None)
  return hf


# ---------------------------------------------------------------------------
# Tensor mapping. Each of our leaves maps, per stacked index s, to HF tensors.

def _layer_ids(cfg: ModelConfig) -> dict[str, list[int]]:
  """Global layer index of every entry of each stack."""
  kinds = cfg.layer_is_moe
  return {"layers": list(range(cfg.num_layers)),
          "mlp": [i for i, m in enumerate(kinds) if not m],
          "moe": [i for i, m in enumerate(kinds) if m]}


_ATTN = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
         "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
         "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
         "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
_MLP = {"gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
        "down": "mlp.down_proj.weight"}


def _to_ours(stack: str, name: str, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """One layer's HF tensor (view) -> our per-layer layout (still a view)."""
  H, K, E, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
  if stack == "layers":
    if name == "q":
      return w.reshape(H, E, D).transpose(2, 0, 1)
    if name in ("k", "v"):
      return w.reshape(K, E, D).transpose(2, 0, 1)
    if name == "o":
      return w.reshape(D, H, E).transpose(1, 2, 0)
    return w
  return w.T  # dense MLP [F, D] / [D, F], router [X, D], one expert's weight


def _hf_shape(stack: str, name: str, cfg: ModelConfig) -> tuple[int, ...]:
  H, K, E, D, F, X, Fm = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model,
                          cfg.mlp_dim, cfg.num_experts, cfg.moe_mlp_dim)
  table = {
      ("layers", "attn_norm"): (D,), ("layers", "mlp_norm"): (D,),
      ("layers", "q"): (H * E, D), ("layers", "k"): (K * E, D),
      ("layers", "v"): (K * E, D), ("layers", "o"): (D, H * E),
      ("layers", "q_norm"): (E,), ("layers", "k_norm"): (E,),
      ("mlp", "gate"): (F, D), ("mlp", "up"): (F, D), ("mlp", "down"): (D, F),
      ("moe", "router"): (X, D), ("moe", "gate"): (Fm, D), ("moe", "up"): (Fm, D),
      ("moe", "down"): (D, Fm),
  }
  return table[(stack, name)]


def _hf_name(stack: str, name: str, layer: int, expert: int | None = None) -> str:
  p = f"model.layers.{layer}."
  if stack == "layers":
    return p + _ATTN[name]
  if stack == "mlp":
    return p + _MLP[name]
  if name == "router":
    return p + "mlp.gate.weight"
  return p + f"mlp.experts.{expert}.{name}_proj.weight"


class _Source:
  """Reads HF tensors with shape checks and records which names were used."""

  def __init__(self, reader: tensorfile.CheckpointReader, cfg: ModelConfig):
    self.reader, self.cfg, self.used = reader, cfg, set()

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.reader:
      raise ValueError(f"Tensor {name!r} is missing from the checkpoint in "
                       f"{self.reader.directory!r}; config.json implies it exists with "
                       f"shape {shape}.")
    got = self.reader.shape(name)
    if tuple(got) != tuple(shape):
      raise ValueError(f"Tensor {name!r} in {self.reader.file_of(name)!r} has shape "
                       f"{tuple(got)}; config.json implies {tuple(shape)}.")
    self.used.add(name)
    return self.reader.get(name)

  def fused_experts(self, layer: int) -> bool:
    return f"model.layers.{layer}.mlp.experts.gate_up_proj" in self.reader

  def layer_tensor(self, stack: str, name: str, layer: int, idx: tuple) -> np.ndarray:
    """Our layout of one layer's parameter, sliced by `idx` (no stacked axis)."""
    cfg = self.cfg
    if stack == "moe" and name != "router":
      X, D, Fm = cfg.num_experts, cfg.d_model, cfg.moe_mlp_dim
      experts = range(X)[idx[0]]
      if self.fused_experts(layer):  # transformers' fused in-memory layout
        p = f"model.layers.{layer}.mlp.experts."
        if name == "down":
          w = self.get(p + "down_proj", (X, D, Fm))
          return w[idx[0]].transpose(0, 2, 1)[(slice(None),) + idx[1:]]
        w = self.get(p + "gate_up_proj", (X, 2 * Fm, D))
        half = w[:, :Fm] if name == "gate" else w[:, Fm:]
        return half[idx[0]].transpose(0, 2, 1)[(slice(None),) + idx[1:]]
      shape = _hf_shape(stack, name, cfg)
      return np.stack([self.get(_hf_name(stack, name, layer, x), shape).T[idx[1:]]
                       for x in experts])
    w = self.get(_hf_name(stack, name, layer), _hf_shape(stack, name, cfg))
    return _to_ours(stack, name, w, cfg)[idx]

  def build(self, path: tuple[str, ...], idx: tuple, dtype) -> np.ndarray:
    """The slice `idx` of our (stacked) parameter at `path`, as a new array."""
    cfg = self.cfg
    if path == ("embed",):
      out = self.get("model.embed_tokens.weight", (cfg.vocab_size, cfg.d_model))[idx]
    elif path == ("final_norm",):
      out = self.get("model.norm.weight", (cfg.d_model,))[idx]
    elif path == ("lm_head",):
      out = self.get("lm_head.weight", (cfg.vocab_size, cfg.d_model))[idx]
    else:
      stack, name = path
      ids = _layer_ids(cfg)[stack][idx[0]]
      out = np.stack([self.layer_tensor(stack, name, l, idx[1:]) for l in ids])
    return np.asarray(out, dtype=dtype)


def _key(idx: tuple) -> tuple:
  return tuple((s.start, s.stop, s.step) for s in idx)


def load_hf(directory: str, cfg: ModelConfig | None = None,
            shardings: Any | None = None, **overrides) -> tuple[Params, ModelConfig]:
  """Imports a local HF Qwen3 / Qwen3-MoE / Llama checkpoint.

  Args:
    directory: holds config.json and model.safetensors (or a sharded index).
    cfg: model config; read from config.json when None (with `overrides`).
    shardings: optional tree of `jax.sharding.Sharding` matching
      `param_shapes(cfg)`; default places everything on the first device.

  Returns:
    (params in `cfg.param_dtype`, cfg).
  """
  hf = read_hf_config(directory)
  if cfg is None:
    cfg = config_from_hf(hf, where=os.path.join(directory, "config.json"), **overrides)
  src = _Source(tensorfile.CheckpointReader(directory), cfg)
  shapes = param_shapes(cfg)
  is_leaf = lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x)
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_leaf)
  if shardings is None:
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    flat_sh = [dev] * len(flat)
  else:
    flat_sh = treedef.flatten_up_to(shardings)
  dtype = np.dtype(jax.numpy.dtype(cfg.param_dtype))
  leaves = []
  for (kp, shape), sharding in zip(flat, flat_sh):
    path = tuple(k.key for k in kp)
    by_index: dict[tuple, list] = {}
    for device, idx in sharding.addressable_devices_indices_map(shape).items():
      idx = tuple(slice(*s.indices(n)) for s, n in zip(idx, shape))
      by_index.setdefault(_key(idx), [idx, []])[1].append(device)
    arrays = []
    for idx, devices in by_index.values():
      host = src.build(path, idx, dtype)  # one shard on the host at a time
      arrays += [jax.device_put(host, d) for d in devices]
      del host
    leaves.append(jax.make_array_from_single_device_arrays(shape, sharding, arrays))
  unused = sorted(set(src.reader.keys()) - src.used - (
      {"lm_head.weight"} if cfg.tie_embeddings else set()))
  unused = [n for n in unused if not n.endswith("rotary_emb.inv_freq")]
  if unused:
    raise ValueError(f"{len(unused)} tensor(s) in {directory!r} are not used by the "
                     f"{'MoE' if cfg.num_experts else 'dense'} model that config.json "
                     f"describes, e.g. {unused[:5]}; check model_type (q_norm / k_norm "
                     "belong to qwen3, not llama) and the layer placement keys "
                     "(decoder_sparse_step, mlp_only_layers).")
  logging.info("Imported %d tensors from %s", len(src.used), directory)
  return jax.tree.unflatten(treedef, leaves), cfg


def _hf_specs(params: Params, cfg: ModelConfig, dtype) -> list[tensorfile.TensorSpec]:
  """(name, shape, dtype, produce) for every HF tensor, each fetched on demand."""
  dtype = np.dtype(jax.numpy.dtype(dtype))
  get = lambda a: np.asarray(jax.device_get(a))
  specs: list[tensorfile.TensorSpec] = [
      ("model.embed_tokens.weight", (cfg.vocab_size, cfg.d_model), dtype,
       lambda: get(params["embed"])),
      ("model.norm.weight", (cfg.d_model,), dtype, lambda: get(params["final_norm"]))]
  if not cfg.tie_embeddings:
    specs.append(("lm_head.weight", (cfg.vocab_size, cfg.d_model), dtype,
                  lambda: get(params["lm_head"])))
  H, K, E, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
  from_ours: dict[str, Callable[[np.ndarray], np.ndarray]] = {
      "q": lambda w: w.transpose(1, 2, 0).reshape(H * E, D),
      "k": lambda w: w.transpose(1, 2, 0).reshape(K * E, D),
      "v": lambda w: w.transpose(1, 2, 0).reshape(K * E, D),
      "o": lambda w: w.reshape(H * E, D).T,
  }
  ids = _layer_ids(cfg)
  for stack in ("layers", "mlp", "moe"):
    if stack not in params:
      continue
    for s, layer in enumerate(ids[stack]):
      for name in params[stack]:
        leaf = params[stack][name]
        shape = _hf_shape(stack, name, cfg)
        if stack == "moe" and name != "router":
          for x in range(cfg.num_experts):
            specs.append((_hf_name(stack, name, layer, x), shape, dtype,
                          lambda leaf=leaf, s=s, x=x: get(leaf[s, x]).T))
          continue
        fn = from_ours.get(name) if stack == "layers" else (lambda w: w.T)
        fn = fn or (lambda w: w)
        specs.append((_hf_name(stack, name, layer), shape, dtype,
                      lambda leaf=leaf, s=s, fn=fn: fn(get(leaf[s]))))
  return sorted(specs, key=lambda t: t[0])


def save_hf(directory: str, params: Params, cfg: ModelConfig,
            base_config: dict[str, Any] | None = None, dtype: str | None = None,
            max_shard_bytes: int = 5 << 30) -> None:
  """Exports params as an HF checkpoint (`config.json` + safetensors).

  Args:
    directory: output directory (created).
    params, cfg: the model.
    base_config: original config.json to keep its metadata (token ids, ...).
    dtype: storage dtype; defaults to `cfg.param_dtype`.
    max_shard_bytes: above this the weights are split with an index file.
  """
  if jax.process_count() > 1:
    raise NotImplementedError("save_hf gathers tensors on one host; run the export "
                              "in a single process (e.g. launch.convert on one host).")
  os.makedirs(directory, exist_ok=True)
  dtype = dtype or cfg.param_dtype
  tensorfile.write_checkpoint(directory, _hf_specs(params, cfg, dtype), max_shard_bytes)
  hf = config_to_hf(dataclasses.replace(cfg, param_dtype=dtype), base_config)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)


def copy_tokenizer_files(src: str, dst: str) -> list[str]:
  """Copies tokenizer / generation config files that exist in `src` to `dst`."""
  copied = []
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(src, name)):
      os.makedirs(dst, exist_ok=True)
      shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
      copied.append(name)
  return copied
