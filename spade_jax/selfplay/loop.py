"""The training run: build every part from a config, resume, iterate, checkpoint."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Mapping

from absl import logging
import jax

from spade_jax import designer as dz
from spade_jax import envs, parallel, rl, sandbox
from spade_jax.checkpoint import Checkpointer
from spade_jax.metrics import MetricsWriter
from spade_jax.models import ByteVocab, ModelConfig
from spade_jax.sampling import SamplingConfig
from spade_jax.selfplay.iteration import SelfPlay, SelfPlayConfig


def make(cls, section: Mapping[str, Any] | None, name: str):
  """Builds dataclass `cls` from a config section, naming any unknown key."""
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


def progress_line(it: int, total: int, m: Mapping[str, float]) -> str:
  """One human-readable line per iteration."""
  rejected = " ".join(f"{k.rsplit('/', 1)[1]}={int(v)}" for k, v in sorted(m.items())
                      if k.startswith("designer/rejected/") and v)
  design = ("design valid -" if "designer/samples" not in m else
            f"design valid {int(m['designer/valid'])}/{int(m['designer/samples'])}"
            + (f" [{rejected}]" if rejected else ""))
  times = " ".join(f"{k[5:]} {v:.1f}s" for k, v in m.items() if k.startswith("time/"))
  return (f"iter {it + 1}/{total} | {design} | regret {m.get('rewards/regret_mean', 0):+.3f}"
          f" | reward nohint {m.get('agent/reward_nohint', 0):.3f}"
          f" hint {m.get('agent/reward_hint', 0):.3f}"
          f" | loss {m.get('train/loss', 0):+.4f} | {times}")


def _say(msg: str, *args) -> None:
  """A line for the person running the job (stdout) and the log."""
  logging.info(msg, *args)
  print(msg % args, flush=True)


def train(config, workdir: str) -> dict[str, float]:
  """Runs (or resumes) self-play training in `workdir`; returns the last metrics."""
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  model_cfg = make(ModelConfig, _section(config, "model"), "model")
  mesh_cfg = make(parallel.MeshConfig, _section(config, "mesh"), "mesh")
  mesh = parallel.make_mesh(mesh_cfg)
  rules = parallel.RULE_SETS[mesh_cfg.rules]
  vocab = ByteVocab()
  if vocab.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the "
                     f"vocabulary's {vocab.vocab_size} ids.")
  trainer = rl.Trainer(model_cfg, make(rl.TrainConfig, _section(config, "train"), "train"),
                       make(rl.LossConfig, _section(config, "loss"), "loss"),
                       make(rl.OptimizerConfig, _section(config, "optimizer"), "optimizer"),
                       mesh, rules)
  sp_cfg = make(SelfPlayConfig, _section(config, "selfplay"), "selfplay")
  sampling = make(SamplingConfig, {"eos_id": vocab.eos_id, "pad_id": vocab.pad_id,
                                   **_section(config, "sampling")}, "sampling")
  reward_cfg = make(dz.RewardConfig, _section(config, "rewards"), "rewards")
  sandbox_cfg = make(sandbox.SandboxConfig, _section(config, "sandbox"), "sandbox")
  validation = make(envs.ValidationConfig,
                    {"max_turns": sp_cfg.max_turns, **_section(config, "validation"),
                     "sandbox": sandbox_cfg}, "validation")
  corpus = dz.Corpus(make(dz.CorpusConfig, _section(config, "corpus"), "corpus"),
                     workdir=workdir, seed=config.seed)
  memory = dz.EnvMemory(make(dz.MemoryConfig, _section(config, "memory"), "memory"))
  total = int(config.iterations)

  ckpt = Checkpointer(workdir, keep=config.get("keep_checkpoints", 3))
  writer = MetricsWriter(workdir)
  with sandbox.EnvPool(sandbox_cfg) as pool:
    if pool.report is not None:
      _say("sandbox: %s", pool.report.summary())
    state = trainer.init_state(jax.random.key(config.seed))
    sp = SelfPlay(sp_cfg, trainer=trainer, state=state, vocab=vocab, sampling=sampling,
                  pool=pool, corpus=corpus, memory=memory, reward_cfg=reward_cfg,
                  validation=validation, seed=config.seed)
    start = 0
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        trainer.abstract_state(), trainer.state_shardings)
    restored = ckpt.restore(abstract, sp.buffer)
    if restored is not None:
      sp.state, sp.buffer, host = restored
      sp.restore_host_state(host)
      start = int(host["next_iteration"])
      _say("resumed from %s at iteration %d of %d", ckpt.directory, start, total)
    if start >= total:
      _say("Nothing to do: %d of %d iterations already done in %s. Raise "
                   "--config.iterations to continue.", start, total, workdir)
    last: dict[str, float] = {}
    every = max(1, int(config.get("checkpoint_every", 1)))
    for it in range(start, total):
      t0 = time.perf_counter()
      metrics = sp.iteration(it)
      metrics["time/iteration"] = time.perf_counter() - t0
      last = writer.write(it + 1, metrics)
      _say("%s", progress_line(it, total, last))
      if (it + 1) % every == 0 or it + 1 == total:
        ckpt.save(it + 1, sp.state, sp.buffer, {**sp.host_state(), "next_iteration": it + 1})
        sp.memory.save(os.path.join(workdir, "memory.json"))
  writer.close()
  ckpt.close()
  return last
