"""Model-only orbax checkpoints: params + config (+ the HF config it came from).

Layout of a directory written by `save_model`:
  params/            orbax StandardCheckpointer tree (restorable into shardings)
  model_config.json  `ModelConfig` fields
  hf_config.json     original HF config.json, when imported from HF
  tokenizer files    copied alongside by the converters
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from spade_jax.models.config import ModelConfig
from spade_jax.models.qwen3 import Params, param_shapes

MODEL_CONFIG_FILE = "model_config.json"
HF_CONFIG_FILE = "hf_config.json"


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
