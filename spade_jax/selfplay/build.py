"""From a config to a run's parts.

A config (an ``ml_collections.ConfigDict`` or a plain mapping) has top-level
scalars (``seed``, ``iterations``, ``checkpoint_every``, ``keep_checkpoints``,
``tokenizer``) and one section per part. Each section maps 1:1 onto a frozen
dataclass, so an unknown key fails naming the key and the valid ones:

========== ==================================================
section    dataclass
========== ==================================================
model      ``spade_jax.models.ModelConfig``
mesh       ``spade_jax.parallel.MeshConfig``
train      ``spade_jax.rl.TrainConfig``
loss       ``spade_jax.rl.LossConfig``
optimizer  ``spade_jax.rl.OptimizerConfig``
sampling   ``spade_jax.sampling.SamplingConfig`` of the agent (eos/pad ids from the
           tokenizer); ``designer_sampling`` and ``hint_sampling`` the same for the
           designer and the hint writer; unset fields take the reference's values
selfplay   :class:`spade_jax.selfplay.SelfPlayConfig`
rewards    :class:`spade_jax.selfplay.RewardConfig`
sandbox    ``spade_jax.sandbox.SandboxConfig``
validation ``spade_jax.envs.ValidationConfig`` (max_turns from selfplay)
corpus     ``spade_jax.designer.CorpusConfig``
memory     ``spade_jax.designer.MemoryConfig``
========== ==================================================

:func:`resolve` turns a config into a :class:`RunConfig` without allocating
anything; :func:`build` adds the tokenizer, the mesh and the trainer;
:meth:`Run.selfplay` assembles the iteration driver around a sandbox pool.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from spade_jax import envs, parallel, rl, sandbox
from spade_jax.designer import Corpus, CorpusConfig, EnvMemory, MemoryConfig
from spade_jax.models import ByteVocab, HFTokenizer, ModelConfig
from spade_jax.sampling import SamplingConfig
from spade_jax.selfplay.iteration import RoleSampling, SelfPlay, SelfPlayConfig
from spade_jax.selfplay.rewards import RewardConfig

# Top-level scalars and their defaults.
SCALARS = {"seed": 0, "iterations": 3, "checkpoint_every": 1, "keep_checkpoints": 3,
           "tokenizer": "byte"}
SECTIONS = {
    "model": ModelConfig, "mesh": parallel.MeshConfig, "train": rl.TrainConfig,
    "loss": rl.LossConfig, "optimizer": rl.OptimizerConfig, "sampling": SamplingConfig,
    "designer_sampling": SamplingConfig, "hint_sampling": SamplingConfig,
    "selfplay": SelfPlayConfig, "rewards": RewardConfig, "sandbox": sandbox.SandboxConfig,
    "validation": envs.ValidationConfig, "corpus": CorpusConfig, "memory": MemoryConfig,
}


# The reference's sampling per role (REFERENCE §1): T 0.6 / top-p 0.95 / top-k 20 for the
# designer and the agent, T 0.3 for the hint writer.
ROLE_SAMPLING = {
    "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "designer_sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "hint_sampling": {"temperature": 0.3, "top_p": 0.95, "top_k": 20},
}


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


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every part's settings, checked; nothing allocated."""

  seed: int
  iterations: int
  checkpoint_every: int
  keep_checkpoints: int
  tokenizer: str
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


def resolve(config, vocab=None) -> RunConfig:
  """Checks ``config`` and turns it into a :class:`RunConfig`.

  Args:
    config: the experiment config.
    vocab: the run's vocabulary (default: loaded from ``config.tokenizer``); its EOS
      and padding ids fill the sampling section.

  Returns:
    The resolved config.
  """
  unknown = sorted(set(config) - set(SCALARS) - set(SECTIONS))
  if unknown:
    raise ValueError(f"Unknown top-level config key(s) {unknown}; valid keys: "
                     f"{sorted(SCALARS)} and the sections {sorted(SECTIONS)}.")
  scalars = {k: config[k] if k in config else v for k, v in SCALARS.items()}
  vocab = vocab or load_vocab(scalars["tokenizer"])
  parts = {name: _section(config, name) for name in SECTIONS}
  for role, defaults in ROLE_SAMPLING.items():
    parts[role] = {"eos_id": vocab.eos_id, "pad_id": vocab.pad_id, **defaults, **parts[role]}
  built = {name: make(SECTIONS[name], parts[name], name)
           for name in SECTIONS if name not in ("validation",)}
  built["validation"] = make(envs.ValidationConfig,
                             {"max_turns": built["selfplay"].max_turns, **parts["validation"],
                              "sandbox": built["sandbox"]}, "validation")
  if vocab.vocab_size > built["model"].vocab_size:
    raise ValueError(f"model.vocab_size={built['model'].vocab_size} is smaller than the "
                     f"tokenizer's {vocab.vocab_size} ids (tokenizer={scalars['tokenizer']!r}).")
  return RunConfig(**scalars, **built)


@dataclasses.dataclass
class Run:
  """A run's parts that exist before the sandbox: settings, vocabulary, mesh, trainer."""

  config: RunConfig
  vocab: Any
  mesh: jax.sharding.Mesh
  rules: Any
  trainer: rl.Trainer

  def selfplay(self, pool: sandbox.EnvPool, workdir: str) -> SelfPlay:
    """The iteration driver over ``pool``, with a freshly initialised train state."""
    c = self.config
    return SelfPlay(c.selfplay, trainer=self.trainer,
                    state=self.trainer.init_state(jax.random.key(c.seed)), vocab=self.vocab,
                    sampling=RoleSampling(c.designer_sampling, c.hint_sampling, c.sampling),
                    pool=pool,
                    corpus=Corpus(c.corpus, workdir=workdir, seed=c.seed),
                    memory=EnvMemory(c.memory), reward_cfg=c.rewards,
                    validation=c.validation, seed=c.seed)


def build(config) -> Run:
  """Resolves ``config`` and builds the tokenizer, the device mesh and the trainer."""
  tokenizer = config["tokenizer"] if "tokenizer" in config else SCALARS["tokenizer"]
  vocab = load_vocab(tokenizer)
  c = resolve(config, vocab)
  mesh = parallel.make_mesh(c.mesh)
  rules = parallel.RULE_SETS[c.mesh.rules]
  trainer = rl.Trainer(c.model, c.train, c.loss, c.optimizer, mesh, rules)
  return Run(c, vocab, mesh, rules, trainer)


__all__ = ["Run", "RunConfig", "build", "load_vocab", "make", "resolve"]
