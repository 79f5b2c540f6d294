"""The suite registry, suite configs, results and the library entry points.

A suite is a function ``run(policy, chat, cfg, *, pool, progress) -> SuiteResult`` registered
in :data:`SUITES` under its name with its frozen config dataclass (a :class:`SuiteConfig`
subclass whose defaults are the paper's sampling for that benchmark, docs/METHOD.md §8). Scores
are floats in [0, 1] named ``<metric>`` (flattened to ``<suite>/<metric>`` by
:func:`run_suites`); records are one JSON-able dict per item.

:class:`EvalConfig` is the config section the training loop reads: which suites, how
often, and the knobs that shrink a suite for a quick run (items, samples, tokens).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

from absl import logging

from spade_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
  """Settings every suite has; each suite's subclass sets its own defaults.

  Attributes:
    limit: items at most, the first ones in the suite's fixed order (0: all).
    samples: completions (or conversations) per item.
    temperature: sampling temperature; 0 is greedy.
    top_p: nucleus mass kept (1 disables it).
    top_k: highest logits kept (0 disables it).
    max_new_tokens: tokens per completion (per assistant turn in multi-turn suites).
    batch_size: KV-cache rows decoding at once; finished rows are refilled at once.
    seed: sampling seed; item i, sample s draws with ``fold_in(fold_in(key(seed), i), s)``,
      so scores do not depend on batch_size.
    record_chars: characters of each completion kept in the records (its end, where the
      answer is); 0 keeps none, -1 all.
  """

  limit: int = 0
  samples: int = 1
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 4096
  batch_size: int = 16
  seed: int = 0
  record_chars: int = 2000

  def __post_init__(self):
    for name in ("samples", "max_new_tokens", "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{type(self).__name__}.{name}={getattr(self, name)!r}; expected "
                         ">= 1.")
    if self.limit < 0:
      raise ValueError(f"{type(self).__name__}.limit={self.limit}; expected >= 0 (0: all).")
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
      raise ValueError(f"{type(self).__name__}: temperature={self.temperature}, top_p="
                       f"{self.top_p}, top_k={self.top_k}; expected temperature >= 0, top_p "
                       "in (0, 1] and top_k >= 0.")

  def clip(self, text: str) -> str | None:
    """What a record keeps of a completion (see ``record_chars``)."""
    if self.record_chars == 0:
      return None
    return text if self.record_chars < 0 else text[-self.record_chars:]


@dataclasses.dataclass
class SuiteResult:
  """A suite's outcome.

  Attributes:
    scores: metric -> value in [0, 1].
    records: one dict per item (its id, samples, parsed answers, scores).
    config: the suite config that ran, as a dict.
    seconds: wall-clock time of the suite.
  """

  scores: dict[str, float]
  records: list[dict[str, Any]]
  config: dict[str, Any] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0


class Progress(Protocol):
  """Told how far a suite is: ``progress(suite, done, total)`` (items or samples)."""

  def __call__(self, suite: str, done: int, total: int) -> None:
    ...


@dataclasses.dataclass(frozen=True)
class Suite:
  """A registered suite.

  Attributes:
    run: ``(policy, chat, cfg, *, pool, progress) -> SuiteResult``.
    config: its :class:`SuiteConfig` subclass.
    needs: what it reads ("offline (procedural)", "local data", ...).
    description: one line.
    check: ``cfg -> None``; raises with the fix when the suite cannot run (a package or a
      data file missing, a malformed row), before any model is loaded.
  """

  run: Callable[..., SuiteResult]
  config: type
  needs: str
  description: str
  check: Callable[[Any], None] | None = None


# Suite name -> Suite. Unknown names raise listing the valid ones.
SUITES: Registry[Suite] = Registry("eval suite", field="eval.suites")


def register(name: str, config: type, needs: str, description: str,
             check: Callable[[Any], None] | None = None):
  """Decorator: registers ``run`` as suite ``name`` with its config class (see :class:`Suite`)."""
  if not (dataclasses.is_dataclass(config) and issubclass(config, SuiteConfig)):
    raise TypeError(f"Suite {name!r}: config must be a SuiteConfig dataclass, got {config}.")

  def wrap(fn):
    SUITES.register(name, Suite(fn, config, needs, description, check))
    return fn
  return wrap


def need(module: str, package: str, suite: str):
  """Imports ``module``, or raises naming the package that provides it and how to install it."""
  import importlib  # pylint: disable=g-import-not-at-top
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"Suite {suite!r} needs the {package!r} package ({e}). Install the "
                      "project's requirements: `source launch/_venv.sh && ensure_venv "
                      "requirements.txt` (bfcl-eval comes from requirements-nodeps.txt, "
                      "installed with --no-deps).") from e


def suite_config(name: str, value: SuiteConfig | Mapping[str, Any] | None = None
                 ) -> SuiteConfig:
  """Suite ``name``'s config: its defaults, updated by a mapping of fields, or as given."""
  cls = SUITES[name].config
  if value is None:
    return cls()
  if isinstance(value, SuiteConfig):
    if not isinstance(value, cls):
      raise TypeError(f"Suite {name!r} takes a {cls.__name__}, got {type(value).__name__}.")
    return value
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(value) - fields)
  if unknown:
    raise ValueError(f"Unknown key(s) {unknown} for eval suite {name!r}; valid keys for "
                     f"{cls.__name__}: {sorted(fields)}.")
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
  return cls(**values)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """The ``eval`` config section: held-out evaluation during and after training.

  Attributes:
    suites: suite names (keys of :data:`SUITES`), run in this order; a string is split at
      commas.
    every: run the suites every this many iterations (0: never during training).
    at_start: also run them once before the first iteration of a fresh run (logged at
      step 0), so a run's table has its starting point.
    limit: items per suite at most (0: the suite's default, usually all).
    samples: samples per item (0: the suite's default, the paper's).
    max_new_tokens: tokens per completion or turn (0: the suite's default).
    batch_size: KV-cache rows (0: the suite's default).
    data_dir: directory of the local benchmark files (aime*.jsonl, gpqa_diamond.jsonl,
      livecodebench*.jsonl); a suite's own ``path`` override wins.
    seed: sampling seed of every suite.
    overrides: suite -> {field: value} for anything else, e.g.
      ``{"bfcl": {"categories": ("base",)}}``.
  """

  suites: tuple[str, ...] = ()
  every: int = 0
  at_start: bool = False
  limit: int = 0
  samples: int = 0
  max_new_tokens: int = 0
  batch_size: int = 0
  data_dir: str = ""
  seed: int = 0
  overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    # "aime,bfcl" (e.g. from --config.eval.suites=aime,bfcl) names two suites.
    suites = tuple(s for s in self.suites.split(",") if s) if isinstance(self.suites, str) \
        else tuple(self.suites)
    object.__setattr__(self, "suites", suites)
    for name in suites:
      SUITES.check(name)
    for name in self.overrides:
      SUITES.check(name)
    for f in ("every", "limit", "samples", "max_new_tokens", "batch_size"):
      if getattr(self, f) < 0:
        raise ValueError(f"eval.{f}={getattr(self, f)}; expected >= 0 (0: the default).")

  def suite_configs(self) -> dict[str, SuiteConfig]:
    """Each of ``suites``' config: its defaults, then the knobs set here, then overrides."""
    out = {}
    for name in self.suites:
      fields = {f.name for f in dataclasses.fields(SUITES[name].config)}
      values: dict[str, Any] = {"seed": self.seed}
      for knob in ("limit", "samples", "max_new_tokens", "batch_size"):
        if getattr(self, knob):
          values[knob] = getattr(self, knob)
      if self.data_dir and "data_dir" in fields:
        values["data_dir"] = self.data_dir
      values.update(self.overrides.get(name, {}))
      out[name] = suite_config(name, values)
    return out


def log_progress(every_s: float = 30.0) -> Progress:
  """A progress reporter that logs (absl) at most every ``every_s`` seconds and at the end."""
  last: dict[str, float] = {}

  def report(suite: str, done: int, total: int) -> None:
    now = time.monotonic()
    if done < total and now - last.get(suite, 0.0) < every_s:
      return
    last[suite] = now
    logging.info("eval %s: %d/%d", suite, done, total)
  return report


def line_progress(stream=None, every_s: float = 1.0) -> Progress:
  """A progress reporter that prints a bar line (``aime  12/30 [####      ] 40% 0:12``)
  per update, at most every ``every_s`` seconds, and the last one always."""
  start: dict[str, float] = {}
  last: dict[str, float] = {}

  def report(suite: str, done: int, total: int) -> None:
    now = time.monotonic()
    start.setdefault(suite, now)
    if done < total and now - last.get(suite, -every_s) < every_s:
      return
    last[suite] = now
    frac = done / total if total else 1.0
    bar = "#" * int(20 * frac)
    spent = int(now - start[suite])
    eta = f" eta {int(spent / frac - spent) // 60}:{int(spent / frac - spent) % 60:02d}" \
        if 0 < frac < 1 else ""
    print(f"{suite:>14} {done:>5}/{total:<5} [{bar:<20}] {100 * frac:3.0f}% "
          f"{spent // 60}:{spent % 60:02d}{eta}", file=stream or sys.stderr, flush=True)
  return report


def check_suites(names: Sequence[str],
                 configs: Mapping[str, SuiteConfig | Mapping[str, Any]] | None = None
                 ) -> dict[str, SuiteConfig]:
  """Resolves each suite's config and runs its check (packages, data files), so a bad
  name, setting or file fails before a model is loaded or another suite runs.

  Returns:
    suite -> its config.
  """
  configs = dict(configs or {})
  for name in list(names) + list(configs):
    SUITES.check(name)
  cfgs = {name: suite_config(name, configs.get(name)) for name in names}
  for name, cfg in cfgs.items():
    if SUITES[name].check is not None:
      SUITES[name].check(cfg)
  return cfgs


def evaluate(policy, chat, names: Sequence[str],
             configs: Mapping[str, SuiteConfig | Mapping[str, Any]] | None = None, *,
             pool=None, progress: Progress | None = None) -> dict[str, SuiteResult]:
  """Runs suites and returns each one's full result (scores and per-item records).

  Args:
    policy: a ``spade_jax.sampling.Sampler`` (its parameters, model config, EOS and
      padding ids; each suite sets its own sampling) or an ``eval.ScriptedPolicy``.
    chat: the policy's ``models.ChatTemplate`` (its ``thinking`` flag is used as set).
    names: suite names.
    configs: suite -> its config, or a mapping of fields over its defaults.
    pool: a ``sandbox.EnvPool`` for the code suites (default: each opens its own from its
      config: ``call_timeout_s``, ``memory_mb``); a pool given here applies its own limits,
      so its ``call_timeout_s`` bounds each batch of tests.
    progress: reporter (default: :func:`log_progress`).

  Returns:
    suite -> :class:`SuiteResult`, in the order of ``names``.
  """
  cfgs = check_suites(names, configs)
  progress = progress or log_progress()
  out = {}
  for name in names:
    t0 = time.perf_counter()
    result = SUITES[name].run(policy, chat, cfgs[name], pool=pool,
                              progress=lambda done, total, _n=name: progress(_n, done, total))
    result.config = dataclasses.asdict(cfgs[name])
    result.seconds = time.perf_counter() - t0
    for metric, value in result.scores.items():
      if not 0.0 <= value <= 1.0:
        raise AssertionError(f"Suite {name!r} scored {metric}={value}, outside [0, 1].")
    logging.info("eval %s: %s (%.0fs)", name, ", ".join(
        f"{k} {v:.4f}" for k, v in result.scores.items()), result.seconds)
    out[name] = result
  return out


def run_suites(policy, chat, names: Sequence[str],
               configs: Mapping[str, SuiteConfig | Mapping[str, Any]] | None = None, *,
               pool=None, progress: Progress | None = None) -> dict[str, float]:
  """Runs suites; returns ``{"<suite>/<metric>": score}`` (what the training loop logs).

  Same arguments as :func:`evaluate`.
  """
  results = evaluate(policy, chat, names, configs, pool=pool, progress=progress)
  return {f"{name}/{metric}": float(value) for name, r in results.items()
          for metric, value in r.scores.items()}


def mean(values: Sequence[float]) -> float:
  """Mean of ``values`` (0 for none)."""
  return float(sum(values) / len(values)) if len(values) else 0.0
