"""From a config to a run's parts.

A config (an ``ml_collections.ConfigDict`` or a plain mapping) has top-level scalars
(:data:`SCALARS`) and one section per part. Each section maps 1:1 onto a frozen dataclass, so
an unknown key fails naming the key and the valid ones:

================= ==================================================
section           dataclass
================= ==================================================
model             ``spade_jax.models.ModelConfig`` (+ ``init_from``, below)
mesh              ``spade_jax.parallel.MeshConfig``
train             ``spade_jax.rl.TrainConfig``
loss              ``spade_jax.rl.LossConfig``
optimizer         ``spade_jax.rl.OptimizerConfig``
sampling          ``spade_jax.sampling.SamplingConfig`` of the agent
designer_sampling the same, for the designer
hint_sampling     the same, for the hint writer
selfplay          :class:`spade_jax.selfplay.SelfPlayConfig`
rewards           :class:`spade_jax.selfplay.RewardConfig`
sandbox           ``spade_jax.sandbox.SandboxConfig``
validation        ``spade_jax.envs.ValidationConfig`` (max_turns, setting from selfplay)
corpus            ``spade_jax.designer.CorpusConfig``
memory            ``spade_jax.designer.MemoryConfig``
static_pool       :class:`spade_jax.selfplay.baselines.StaticPoolConfig` (the static-pool
                  baseline, ``selfplay.env_source="static_pool"``)
rlve              :class:`spade_jax.selfplay.rlve.RLVEConfig` (the RLVE baseline,
                  ``selfplay.env_source="rlve"``)
eval              ``spade_jax.eval.EvalConfig`` (held-out suites during training; default
                  none)
audit             :class:`spade_jax.selfplay.audit.AuditConfig` (the contamination audit:
                  ``mode`` flag | drop | off, default flag)
================= ==================================================

Sampling sections get their EOS and padding ids from the tokenizer; unset fields take the
reference's values (:data:`ROLE_SAMPLING`).

**A pretrained start.** ``model.init_from`` is ``""`` (random weights), ``"hf:DIR"`` (a
Hugging Face checkpoint: config.json, safetensors, tokenizer.json), ``"orbax:DIR"`` (a
model checkpoint written by ``launch.convert`` or ``launch.export``) or ``"gguf:FILE"`` (a
llama.cpp file or a packaged preset's name, converted once into a cached HF directory and
then read as ``hf:``; ``models.resolve_checkpoint``). The architecture then
comes from the checkpoint; any architecture field the section also sets must agree with it
(runtime fields in :data:`RUNTIME_FIELDS` may differ), and the tokenizer defaults to the
checkpoint's. Every check reads only small JSON files, so a config whose model, tokenizer and
checkpoint disagree fails before anything is allocated.

:func:`resolve` turns a config into a :class:`RunConfig` without allocating anything;
:func:`build_run` adds the tokenizer, the mesh and the trainer; :meth:`Run.selfplay` loads or
initialises the weights and assembles the iteration driver around a sandbox pool.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Mapping

from absl import logging
import jax

from spade_jax import envs, parallel, rl, sandbox
from spade_jax.designer import Corpus, CorpusConfig, EnvMemory, MemoryConfig
from spade_jax.eval import EvalConfig
from spade_jax.models import (ByteVocab, HFTokenizer, ModelConfig, config_from_hf, load_hf,
                              load_model, load_model_config, num_params, read_hf_config,
                              resolve_checkpoint)
from spade_jax.sampling import SamplingConfig
from spade_jax.selfplay.audit import AuditConfig, Auditor, decontaminate
from spade_jax.selfplay.baselines import StaticPoolConfig, make_env_source
from spade_jax.selfplay.iteration import RoleSampling, SelfPlay, SelfPlayConfig
from spade_jax.selfplay.rewards import RewardConfig
from spade_jax.selfplay.rlve import RLVEConfig

# Top-level scalars and their defaults. `tokenizer`: "byte" (seqio bytes), a directory or
# file holding a Hugging Face tokenizer.json, or "" (the checkpoint's, else "byte").
SCALARS = {"seed": 0, "iterations": 3, "checkpoint_every": 1, "keep_checkpoints": 3,
           "tokenizer": ""}
# Scalars a rerun on the same workdir may change (they do not change what a step computes).
RESUMABLE_CHANGES = ("iterations", "checkpoint_every", "keep_checkpoints")
SECTIONS = {
    "model": ModelConfig, "mesh": parallel.MeshConfig, "train": rl.TrainConfig,
    "loss": rl.LossConfig, "optimizer": rl.OptimizerConfig, "sampling": SamplingConfig,
    "designer_sampling": SamplingConfig, "hint_sampling": SamplingConfig,
    "selfplay": SelfPlayConfig, "rewards": RewardConfig, "sandbox": sandbox.SandboxConfig,
    "validation": envs.ValidationConfig, "corpus": CorpusConfig, "memory": MemoryConfig,
    "static_pool": StaticPoolConfig, "rlve": RLVEConfig, "eval": EvalConfig,
    "audit": AuditConfig,
}
# Model fields that say how to run a checkpoint rather than what it is.
RUNTIME_FIELDS = ("param_dtype", "compute_dtype", "remat", "scan_layers", "moe_impl",
                  "moe_capacity_factor", "attention", "decode_attention",
                  "max_position_embeddings", "mlp_grad")

# The reference's sampling per role (docs/METHOD.md §1): T 0.6 / top-p 0.95 / top-k 20 for the
# designer and the agent, T 0.3 for the hint writer.
ROLE_SAMPLING = {
    "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "designer_sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "hint_sampling": {"temperature": 0.3, "top_p": 0.95, "top_k": 20},
}


_NO_DEFAULT = object()


def default_value(key: str) -> Any:
  """The dataclass default of a flat config key "section.field" (a `SECTIONS` field or a
  top-level scalar), or a marker no config value equals when it has none."""
  section, _, name = key.partition(".")
  if not name:
    return SCALARS.get(section, _NO_DEFAULT)
  cls = SECTIONS.get(section)
  field = next((f for f in dataclasses.fields(cls) if f.name == name), None) if cls else None
  if field is None or field.default is dataclasses.MISSING:
    return _NO_DEFAULT
  value = field.default
  return list(value) if isinstance(value, tuple) else value


def make(cls, section: Mapping[str, Any] | None, name: str):
  """Builds dataclass ``cls`` from a config section, naming any unknown key."""
  values = dict(section or {})
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ValueError(f"Unknown key(s) {unknown} in config section {name!r}; "
                     f"valid keys for {cls.__name__}: {sorted(fields)}.")
  return cls(**values)


def _section(config, name: str) -> dict[str, Any]:
  if name not in config:
    return {}
  value = config[name]
  return value.to_dict() if hasattr(value, "to_dict") else dict(value)


def load_vocab(tokenizer: str):
  """The run's vocabulary: ``"byte"`` (seqio bytes, the tiny presets) or the path of a
  directory (or file) holding a Hugging Face ``tokenizer.json``."""
  return ByteVocab() if tokenizer == "byte" else HFTokenizer(tokenizer)


def parse_init_from(init_from: str) -> tuple[str, str]:
  """``"hf:DIR"`` / ``"orbax:DIR"`` -> (kind, DIR); ``"gguf:FILE"`` -> ("hf", the cached
  conversion's DIR); ``""`` -> ("", "") (``models.resolve_checkpoint``)."""
  return resolve_checkpoint(init_from, field="model.init_from")


def model_config(section: Mapping[str, Any], dry_run: bool = False) -> tuple[ModelConfig, str]:
  """The model section -> (ModelConfig, init_from), checked against the checkpoint.

  Args:
    section: the config's model section (ModelConfig fields and ``init_from``).
    dry_run: a missing checkpoint is allowed (the section's own fields describe the model).

  Returns:
    The model config and the normalised ``init_from``.
  """
  section = dict(section)
  init_from = section.pop("init_from", "") or ""
  try:
    kind, path = parse_init_from(init_from)
  except FileNotFoundError:  # a gguf: file that is not there
    if not dry_run:
      raise
    return make(ModelConfig, section, "model"), init_from
  if not kind:
    return make(ModelConfig, section, "model"), ""
  if not os.path.isdir(path):
    if dry_run:
      return make(ModelConfig, section, "model"), init_from
    raise FileNotFoundError(
        f"model.init_from={init_from!r}: {path!r} is not a directory. Download the "
        "checkpoint there (e.g. `huggingface-cli download Qwen/Qwen3-4B-Instruct-2507 "
        f"--local-dir {path}`), or pass --config.model.init_from=hf:DIR.")
  if kind == "hf":
    base = config_from_hf(read_hf_config(path), where=os.path.join(path, "config.json"))
  else:
    base = load_model_config(path)[0]
  make(ModelConfig, section, "model")  # unknown keys
  wanted = dataclasses.replace(base, **section)
  differ = sorted(k for k in section if k not in RUNTIME_FIELDS
                  and getattr(wanted, k) != getattr(base, k))
  if differ:
    detail = ", ".join(f"{k}: config {getattr(wanted, k)!r} vs checkpoint "
                       f"{getattr(base, k)!r}" for k in differ)
    raise ValueError(f"The model section disagrees with the checkpoint {init_from!r}: "
                     f"{detail}. Drop these keys from the config (the checkpoint defines "
                     f"the architecture) or point model.init_from at the right checkpoint.")
  return dataclasses.replace(base, **{k: v for k, v in section.items()
                                      if k in RUNTIME_FIELDS}), init_from


def tokenizer_path(tokenizer: str, init_from: str) -> str:
  """The tokenizer the run uses: the configured one, else the checkpoint's, else bytes."""
  if tokenizer:
    return tokenizer
  _, path = parse_init_from(init_from)
  if not path:
    return "byte"
  if not os.path.isfile(os.path.join(path, "tokenizer.json")):
    raise FileNotFoundError(f"model.init_from={init_from!r} has no tokenizer.json; copy the "
                            "checkpoint's tokenizer files there or set --config.tokenizer=DIR.")
  return path


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every part's settings, checked; nothing allocated."""

  seed: int
  iterations: int
  checkpoint_every: int
  keep_checkpoints: int
  tokenizer: str
  init_from: str
  model: ModelConfig
  mesh: parallel.MeshConfig
  train: rl.TrainConfig
  loss: rl.LossConfig
  optimizer: rl.OptimizerConfig
  sampling: SamplingConfig
  designer_sampling: SamplingConfig
  hint_sampling: SamplingConfig
  selfplay: SelfPlayConfig
  rewards: RewardConfig
  sandbox: sandbox.SandboxConfig
  validation: envs.ValidationConfig
  corpus: CorpusConfig
  memory: MemoryConfig
  static_pool: StaticPoolConfig
  rlve: RLVEConfig
  eval: EvalConfig
  audit: AuditConfig


def resolve(config, vocab=None, *, dry_run: bool = False) -> RunConfig:
  """Checks ``config`` and turns it into a :class:`RunConfig`.

  Args:
    config: the experiment config.
    vocab: the run's vocabulary (default: loaded from the resolved tokenizer); its EOS and
      padding ids fill the sampling sections.
    dry_run: plan without weights: a missing ``init_from`` checkpoint is allowed and the
      tokenizer is not loaded when absent (the model's vocabulary bounds its ids).

  Returns:
    The resolved config.
  """
  unknown = sorted(set(config) - set(SCALARS) - set(SECTIONS))
  if unknown:
    raise ValueError(f"Unknown top-level config key(s) {unknown}; valid keys: "
                     f"{sorted(SCALARS)} and the sections {sorted(SECTIONS)}.")
  scalars = {k: config[k] if k in config else v for k, v in SCALARS.items()}
  parts = {name: _section(config, name) for name in SECTIONS}
  model, init_from = model_config(parts.pop("model"), dry_run=dry_run)
  try:
    scalars["tokenizer"] = tokenizer_path(scalars["tokenizer"], init_from)
  except FileNotFoundError:
    if not dry_run:
      raise
  tok = scalars["tokenizer"]
  if vocab is None and not (dry_run and tok != "byte" and not os.path.exists(tok)):
    vocab = load_vocab(tok)
  eos_pad = {"eos_id": vocab.eos_id, "pad_id": vocab.pad_id} if vocab is not None else {}
  for role, defaults in ROLE_SAMPLING.items():
    parts[role] = {**eos_pad, **defaults, **parts[role]}
  built = {name: make(SECTIONS[name], parts[name], name)
           for name in parts if name != "validation"}
  built["validation"] = make(envs.ValidationConfig,
                             {"max_turns": built["selfplay"].max_turns,
                              "setting": built["selfplay"].setting, **parts["validation"],
                              "sandbox": built["sandbox"]}, "validation")
  if vocab is not None and vocab.vocab_size > model.vocab_size:
    raise ValueError(f"model.vocab_size={model.vocab_size} is smaller than the "
                     f"tokenizer's {vocab.vocab_size} ids (tokenizer={scalars['tokenizer']!r}); "
                     "use the checkpoint's tokenizer or a model with a larger vocabulary.")
  return RunConfig(**scalars, init_from=init_from, model=model, **built)


@dataclasses.dataclass
class Run:
  """A run's parts that exist before the sandbox: settings, vocabulary, mesh, trainer."""

  config: RunConfig
  vocab: Any
  mesh: jax.sharding.Mesh
  rules: Any
  trainer: rl.Trainer

  def initial_state(self) -> rl.TrainState:
    """Random weights, or the ``init_from`` checkpoint streamed into the mesh's shardings
    (a frozen reference copy is kept only when the KL coefficient is non-zero)."""
    c = self.config
    kind, path = parse_init_from(c.init_from)
    if not kind:
      return self.trainer.init_state(jax.random.key(c.seed))
    t0 = time.perf_counter()
    logging.info("Loading %s weights from %s", kind, path)
    shardings = self.trainer.state_shardings.params
    if kind == "hf":
      params, _ = load_hf(path, c.model, shardings=shardings)
    else:
      params, _, _ = load_model(path, shardings=shardings)
    state = self.trainer.state_from_params(params)
    logging.info("Loaded %s parameters in %.1fs", f"{num_params(c.model):,}",
                 time.perf_counter() - t0)
    return state

  def env_source(self):
    """The baseline env source of ``selfplay.env_source`` (None for the designer)."""
    c = self.config
    return make_env_source(c.selfplay.env_source, static_pool=c.static_pool, rlve=c.rlve,
                           setting=c.selfplay.setting, validation=c.validation, seed=c.seed)

  def selfplay(self, pool: sandbox.EnvPool, workdir: str) -> SelfPlay:
    """The iteration driver over ``pool``, with the initial train state. A baseline env
    source gets no corpus (only the designer reads documents); with
    ``corpus.decontaminate`` the corpus skips the documents the audit flags. One auditor
    (the ``audit`` section) serves the corpus and the stages."""
    c = self.config
    source = self.env_source()
    auditor = Auditor.from_config(c)  # one per run: the rooms' checks and the corpus's
    corpus = Corpus(c.corpus, workdir=workdir, seed=c.seed) if source is None else None
    if corpus is not None and c.corpus.decontaminate:
      corpus = decontaminate(corpus, auditor)
    return SelfPlay(c.selfplay, trainer=self.trainer, state=self.initial_state(),
                    vocab=self.vocab,
                    sampling=RoleSampling(c.designer_sampling, c.hint_sampling, c.sampling),
                    pool=pool, corpus=corpus, memory=EnvMemory(c.memory),
                    reward_cfg=c.rewards, validation=c.validation, seed=c.seed,
                    env_source=source, auditor=auditor)


def build_run(config) -> Run:
  """Resolves ``config`` and builds the tokenizer, the device mesh and the trainer."""
  c = resolve(config)
  vocab = load_vocab(c.tokenizer)
  mesh = parallel.make_mesh(c.mesh)
  rules = parallel.RULE_SETS[c.mesh.rules]
  trainer = rl.Trainer(c.model, c.train, c.loss, c.optimizer, mesh, rules)
  return Run(c, vocab, mesh, rules, trainer)


def summary(run: Run) -> str:
  """One line: the model, where its weights come from, the mesh and the run's shape."""
  c, m = run.config, run.config.model
  moe = f", {m.num_experts} experts" if m.num_experts else ""
  devices = run.mesh.devices.size
  kinds = {d.platform for d in run.mesh.devices.flat}
  mesh = " ".join(f"{k}={v}" for k, v in run.mesh.shape.items() if v > 1) or "1 device"
  s = c.selfplay
  source = "" if s.env_source == "designer" else f" {s.env_source} baseline"
  evals = (f" | eval {','.join(c.eval.suites)} every {c.eval.every or '-'} and at the end"
           if c.eval.suites else "")
  return (f"run: {num_params(m) / 1e6:,.1f}M params ({m.num_layers} layers, d {m.d_model}"
          f"{moe}, vocab {m.vocab_size}) from {c.init_from or 'random init'} | tokenizer "
          f"{c.tokenizer} | mesh {mesh} ({c.mesh.rules}) on {devices} {'/'.join(kinds)} "
          f"device(s) | {s.setting}{source}: {s.num_envs} envs x {s.plays}+{s.hinted_plays} "
          f"plays, regen {s.regen_every}, {c.rewards.variant} reward | {c.iterations} "
          f"iterations{evals}")


__all__ = ["Run", "RunConfig", "build_run", "load_vocab", "make", "model_config",
           "parse_init_from", "resolve", "summary"]
