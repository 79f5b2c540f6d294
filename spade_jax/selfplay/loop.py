"""The training run: build the parts, resume, iterate, evaluate, checkpoint, report.

Held-out evaluation (the ``eval`` section, ``spade_jax.eval.EvalConfig``) runs inside the
loop: after iteration ``it``'s train step, when ``eval.every`` divides ``it + 1`` and after
the last iteration, the suites run with the current policy (the agent's weights and chat
template, the run's sandbox pool) and their scores join that iteration's metrics row as
``eval/<suite>/<metric>``. One row per step, so ``read_metrics`` rows carry eval keys only
at the steps that evaluated, and a resumed run (which drops rows past its checkpoint and
redoes those iterations, evaluation included) writes the same rows as an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

from absl import logging
from etils import epath
import jax

from spade_jax import console
from spade_jax import hostmem
from spade_jax import eval as eval_lib
from spade_jax import sandbox
from spade_jax.checkpoint import Checkpointer
from spade_jax.metrics import MetricsWriter
from spade_jax.sampling import Sampler
from spade_jax.selfplay.build import RESUMABLE_CHANGES, build_run, default_value, summary
from spade_jax.selfplay.stages.design import lone_skill_warning


def progress_line(it: int, total: int, m: Mapping[str, float]) -> str:
  """One human-readable line per iteration."""
  rejected = " ".join(f"{k.rsplit('/', 1)[1]}={int(v)}" for k, v in sorted(m.items())
                      if k.startswith("designer/rejected/") and v)
  if "rlve/level_mean" in m:
    design = (f"rlve level {m['rlve/level_mean']:.2f} (top mean {m['rlve/high_mean']:.2f},"
              f" raised {int(m['rlve/raised'])})")
  elif "static_pool/epoch" in m:
    design = (f"static pool {int(m['static_pool/programs'])} programs, epoch "
              f"{int(m['static_pool/epoch'])}")
  else:
    design = ("design valid -" if "designer/samples" not in m else
              f"design valid {int(m['designer/valid'])}/{int(m['designer/samples'])}"
              + (f" [{rejected}]" if rejected else ""))
  if m.get("designer/resampled"):
    design += f" resampled {int(m['designer/resampled'])}"
  credit = ("" if not m.get("designer/credited") else
            f" | credit {int(m['designer/credited'])} (trained {int(m['designer/trained'])},"
            f" mean {m['designer/reward_mean']:+.2f})")
  tis = ("" if "train/tis_weight_mean" not in m else
         f" tis w {m['train/tis_weight_mean']:.3f} [{m['train/tis_weight_min']:.2f},"
         f" {m['train/tis_weight_max']:.2f}]")
  # Compile seconds (`time/*_compile`, part of their stage's time) only when there were any.
  times = " ".join(f"{k[5:]} {v:.1f}s" for k, v in m.items()
                   if k.startswith("time/") and (v >= 0.05 or not k.endswith("_compile")))
  # Suite-level scores (a suite's `<group>/<metric>` too), not per-item breakdowns.
  evals = " ".join(f"{k[5:]} {v:.3f}" for k, v in sorted(m.items()) if k.startswith("eval/")
                   and 2 <= k.count("/") <= 3 and not k.split("/", 2)[2].startswith("success/"))
  return (f"iter {it + 1}/{total} | {design}{credit}"
          f" | regret {m.get('rewards/regret_mean', 0):+.3f}"
          f" | reward nohint {m.get('agent/reward_nohint', 0):.3f}"
          f" hint {m.get('agent/reward_hint', 0):.3f}"
          f" | loss {m.get('train/loss', 0):+.4f}{tis} | {times}"
          + (f" | eval {evals}" if evals else ""))


def sampling_line(sp) -> str:
  """The sampling rule of each role, for the start of a run."""
  parts = []
  for role in ("designer", "hint", "agent"):
    r = getattr(sp.sampling, role)
    parts.append(f"{role} T {r.temperature:g} top-p {r.top_p:g} top-k {r.top_k}")
  return "sampling: " + " | ".join(parts)


def eval_due(cfg: eval_lib.EvalConfig, it: int, iterations: int) -> bool:
  """Whether the suites run after iteration ``it``: every ``cfg.every`` iterations and
  after the last one (``every=0``: only after the last); never without suites."""
  if not cfg.suites:
    return False
  return bool(cfg.every and (it + 1) % cfg.every == 0) or it + 1 == iterations


def evaluate_policy(sp, cfg: eval_lib.EvalConfig, pool) -> dict[str, float]:
  """Runs ``cfg``'s suites with ``sp``'s current policy (:func:`evaluate_params` on the
  agent's current weights, sampling rule and chat template).

  Returns:
    ``{"eval/<suite>/<metric>": score}``.
  """
  return evaluate_params(sp.state.params, sp.trainer, sp.sampling.agent, sp.agent_chat, cfg,
                         pool)


def evaluate_params(params, trainer, sampling, chat, cfg: eval_lib.EvalConfig,
                    pool) -> dict[str, float]:
  """Runs ``cfg``'s suites with a ``Sampler`` on ``params`` (``trainer``'s model, mesh and
  rules; ``sampling`` the agent's rule, each suite sets its own temperature and seed), the
  agent's chat template ``chat``, code in ``pool``. A run's evaluation at any iteration is
  this call on that iteration's weights, so one made outside the run (e.g. of the weights
  several runs start from) scores exactly as the run's own would.

  Returns:
    ``{"eval/<suite>/<metric>": score}``.
  """
  policy = Sampler(params, trainer.model_cfg, sampling, jax.random.key(cfg.seed),
                   mesh=trainer.mesh, rules=trainer.rules)
  scores = eval_lib.run_suites(policy, chat, cfg.suites, cfg.suite_configs(), pool=pool)
  return {f"eval/{k}": v for k, v in scores.items()}


def _say(msg: str, *args) -> None:
  """A line for the person running the job, on stdout, once: not also logged, which
  would show it twice on a console where INFO logs go to stderr."""
  print(msg % args, flush=True)


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, Mapping):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
  return out


def check_config(config, workdir: epath.Path) -> None:
  """Writes the run's config to ``<workdir>/config.json``, or refuses a different one.

  A rerun may change only :data:`RESUMABLE_CHANGES`; any other difference raises, naming
  the differing keys, so a workdir never mixes two experiments. A key the saved config
  lacks (a setting added since the run began) matches when the rerun gives it its
  default: the run computed with that default.
  """
  current = _flat(json.loads(json.dumps(
      config.to_dict() if hasattr(config, "to_dict") else dict(config), default=str)))
  path = workdir / "config.json"
  if path.exists():
    saved = _flat(json.loads(path.read_text()))
    keys = sorted(set(saved) | set(current))
    differ = [k for k in keys if k not in RESUMABLE_CHANGES
              and saved.get(k, "<unset>") != current.get(k, "<unset>")
              and not (k not in saved and current[k] == default_value(k))]
    if differ:
      detail = "; ".join(f"{k}: {saved.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
                         for k in differ[:12])
      raise ValueError(
          f"{path} holds a different config ({len(differ)} key(s) differ: {detail}). A "
          f"workdir belongs to one run: use a new --workdir, or rerun with the saved config "
          f"(only {', '.join(RESUMABLE_CHANGES)} may change).")
  path.write_text(json.dumps(current, indent=1, sort_keys=True))


def train(config, workdir: str) -> dict[str, float]:
  """Runs (or resumes) self-play training in ``workdir``; returns the last metrics.

  ``workdir`` may be local or remote (``gs://...``): paths go through ``etils.epath``.
  """
  wd = epath.Path(workdir)
  if "://" not in workdir:
    wd = wd.resolve()
  wd.mkdir(parents=True, exist_ok=True)
  workdir = str(wd)
  run = build_run(config)
  check_config(config, wd)
  c, trainer = run.config, run.trainer
  if c.eval.suites:  # a missing package or data file fails before anything runs
    eval_lib.check_suites(c.eval.suites, c.eval.suite_configs())
  _say("%s", summary(run))
  for warning in (hostmem.map_limit_warning(jax.default_backend()),
                  lone_skill_warning(c.selfplay, c.rewards.center_by_skill)):
    if warning:
      _say("warning: %s", warning)
  ckpt = Checkpointer(workdir, keep=c.keep_checkpoints)
  writer = None
  with sandbox.EnvPool(c.sandbox) as pool:
    if pool.report is not None:
      _say("sandbox: %s", pool.report.summary())
    if c.init_from:
      _say("loading weights from %s", c.init_from)
    sp = run.selfplay(pool, workdir)
    _say("%s", sampling_line(sp))
    start = 0
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        trainer.abstract_state(), trainer.state_shardings)
    restored = ckpt.restore(abstract, sp.buffer)
    if restored is not None:
      sp.state, sp.buffer, host = restored
      sp.restore_host_state(host)
      start = int(host["next_iteration"])
      _say("resumed from %s at iteration %d of %d", ckpt.directory, start, c.iterations)
    with console.hushed():  # TensorBoard's writer imports TensorFlow, which chatters
      writer = MetricsWriter(workdir, resume_step=start)
    if start >= c.iterations:
      _say("Nothing to do: %d of %d iterations already done in %s. Raise "
           "--config.iterations to continue.", start, c.iterations, workdir)
    last: dict[str, float] = {}
    every = max(1, c.checkpoint_every)
    if start == 0 and c.eval.suites and c.eval.at_start:
      _say("eval before training: %s ...", ",".join(c.eval.suites))
      t1 = time.perf_counter()
      first = evaluate_policy(sp, c.eval, pool)
      first["time/eval"] = time.perf_counter() - t1
      writer.write(0, first)
      _say("eval at start | %s", " ".join(f"{k[5:]} {v:.3f}" for k, v in sorted(first.items())
                                            if k.startswith("eval/")))
    for it in range(start, c.iterations):
      # The first iteration in a process compiles every program: show its phases.
      sp.on_phase = (lambda p, it=it: _say("  iter %d: %s ...", it + 1, p)) if it == start \
          else (lambda p, it=it: logging.info("iter %d: %s", it + 1, p))
      t0 = time.perf_counter()
      metrics = sp.iteration(it)
      metrics["time/iteration"] = time.perf_counter() - t0
      if eval_due(c.eval, it, c.iterations):
        sp.on_phase("eval " + ",".join(c.eval.suites))
        t1 = time.perf_counter()
        metrics.update(evaluate_policy(sp, c.eval, pool))
        metrics["time/eval"] = time.perf_counter() - t1
      last = writer.write(it + 1, metrics)
      writer.write_records("designer_samples", it + 1, sp.sample_records)
      sp.sample_records = []
      _say("%s", progress_line(it, c.iterations, last))
      if (it + 1) % every == 0 or it + 1 == c.iterations:
        ckpt.save(it + 1, sp.state, sp.buffer, {**sp.host_state(), "next_iteration": it + 1})
        sp.memory.save(str(wd / "memory.json"))
  writer.close()
  ckpt.close()
  return last
