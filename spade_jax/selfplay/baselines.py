"""Where env programs come from: the designer (SPADE) or a baseline source (docs/METHOD.md §7).

``selfplay.env_source`` names an entry of :data:`ENV_SOURCES`:

* ``"designer"``: the policy writes the programs (``stages.design.Design``; the paper's method);
* ``"static_pool"``: a fixed set of programs (:class:`StaticPool`), drawn without
  replacement; ``static_pool.path=""`` is the setting's built-in programs;
* ``"rlve"``: reasoning-gym problems under a difficulty controller
  (:class:`RLVESource`, :mod:`spade_jax.selfplay.rlve`).

A baseline source replaces the design stage: at each regeneration every slot gets a
program from it (:meth:`EnvSource.draw`), nothing is validated per iteration, no hint is
written unless ``selfplay.hinted_plays > 0``, and after the plays the source hears each
slot's unhinted rewards (:meth:`EnvSource.observe`). The regret stage still runs and gives
the agent its group-relative advantages per env; there are no designer samples, no
designer rows and the environment memory stays empty. The source's host state
(:meth:`EnvSource.state`) is checkpointed with the run's, so a resumed run draws the same
programs.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Any, Mapping, Protocol

from absl import logging
from etils import epath
import numpy as np

from spade_jax import envs
from spade_jax.registry import Registry
from spade_jax.selfplay import rlve as rlve_lib

# Keys a JSONL row may hold its program under, tried in order when static_pool.key is "".
JSONL_KEYS = ("program", "source")
# Keys a JSONL row may name its program with (else "<file>:<line>").
JSONL_ID_KEYS = ("id", "name")


@dataclasses.dataclass(frozen=True)
class Drawn:
  """A program given to a slot.

  Attributes:
    source: the program's source.
    origin: the source's name (the slot's ``origin``).
    doc_id: what it is, for logs and checkpoints (a file name, a task's family/level/seed).
  """

  source: str
  origin: str
  doc_id: str


class EnvSource(Protocol):
  """A baseline's supply of env programs (see the module docstring)."""

  name: str

  def draw(self, it: int, num_envs: int, pool) -> list[Drawn]:
    """One program per slot for iteration ``it`` (``pool``: the run's sandbox)."""

  def observe(self, it: int, rewards: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Hears the iteration's unhinted plays: f32[E, N] rewards, bool[E, N] which count.

    Returns:
      Metrics (scalars) of the source.
    """

  def state(self) -> dict[str, Any]:
    """JSON-able host state for checkpoints."""

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues from :meth:`state`'s output."""


# ---------------------------------------------------------------------------------------------
# Static pool.


@dataclasses.dataclass(frozen=True)
class StaticPoolConfig:
  """The ``static_pool`` config section (used when ``selfplay.env_source="static_pool"``).

  Attributes:
    path: a directory of ``*.py`` programs (one each, sorted by name), a ``.jsonl`` file
      (one program per line under ``key``), or "" for the setting's built-in programs.
    key: the JSONL key holding a program ("": "program", else "source"). A row's "id" (or
      "name") names it; else "<file>:<line>".
    validate: validate every program once, at the run's first draw (invalid ones are
      skipped, each with a logged reason); False trusts the pool.
  """

  path: str = ""
  key: str = ""
  validate: bool = True


def load_programs(path: str, setting: str, key: str = "") -> dict[str, str]:
  """Program id -> source of a static pool (see :class:`StaticPoolConfig`).

  Model output is accepted too: an entry that is not valid Python goes through
  ``envs.extract_program`` (fenced code); entries without code are dropped with a logged
  reason.
  """
  if not path:
    raw = envs.builtin_programs(setting)
  else:
    p = epath.Path(path)
    if p.is_dir():
      raw = {f.name: f.read_text() for f in sorted(p.glob("*.py"), key=lambda f: f.name)}
    elif p.is_file() and p.name.endswith(".jsonl"):
      raw = _read_jsonl(p, key)
    else:
      raise FileNotFoundError(
          f"static_pool.path={path!r} is neither a directory of *.py programs nor a .jsonl "
          "file; point it at one (or set it to '' for the built-in programs).")
  out = {}
  for pid, text in raw.items():
    source = text if _parses(text) else envs.extract_program(text)
    if source is None:
      logging.warning("static pool: skipping %s: no_code (no ...Env class found)", pid)
      continue
    out[pid] = source
  if not out:
    raise ValueError(f"static_pool.path={path!r} holds no env program (expected *.py files "
                     f"or JSONL rows with a program under {key or ' or '.join(JSONL_KEYS)}).")
  return out


def _parses(text: str) -> bool:
  try:
    ast.parse(text)
  except (SyntaxError, ValueError):
    return False
  return True


def _read_jsonl(path: epath.Path, key: str) -> dict[str, str]:
  out: dict[str, str] = {}
  for n, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n} is not JSON ({e}); a static pool JSONL file holds one "
                       "object per line.") from e
    keys = (key,) if key else JSONL_KEYS
    found = next((k for k in keys if isinstance(row, dict) and isinstance(row.get(k), str)),
                 None)
    if found is None:
      raise ValueError(f"{path}:{n} has no program under {' or '.join(map(repr, keys))}; "
                       "set static_pool.key to the key that holds it.")
    pid = next((str(row[k]) for k in JSONL_ID_KEYS if row.get(k) not in (None, "")),
               f"{path.name}:{n}")
    out[pid if pid not in out else f"{pid}@{path.name}:{n}"] = row[found]
  return out


class StaticPool:
  """Pre-written programs drawn without replacement (docs/METHOD.md §7's static pool).

  Each epoch is a permutation of the valid programs (``fold(seed, epoch)``); draws take
  the next programs of it and a new epoch starts, reshuffled, when it runs out (a pool
  smaller than ``num_envs`` thus repeats programs within one draw). The valid set, the
  epoch and the position are the checkpointed state, so a resumed run neither validates
  again nor draws differently.
  """

  name = "static_pool"

  def __init__(self, cfg: StaticPoolConfig, *, setting: str,
               validation: envs.ValidationConfig, seed: int = 0):
    self.cfg, self.validation, self.seed = cfg, validation, seed
    self.programs = load_programs(cfg.path, setting, cfg.key)
    self.valid: list[str] | None = None   # ids of playable programs; None: not checked yet
    self.skipped: dict[str, str] = {}     # id -> why it was skipped
    self.epoch, self.pos = 0, 0
    self._order: tuple[int, np.ndarray] | None = None

  def prepare(self, pool) -> None:
    """Validates every program once (when ``validate``); invalid ones are skipped."""
    if self.valid is not None:
      return
    ids = list(self.programs)
    if not self.cfg.validate:
      self.valid = ids
      return
    verdicts = envs.validate_many([self.programs[i] for i in ids], pool,
                                  dataclasses.replace(self.validation, extract=False))
    self.valid = []
    for pid, v in zip(ids, verdicts):
      if v.valid:
        self.valid.append(pid)
        continue
      self.skipped[pid] = v.reason or "invalid"
      logging.warning("static pool: skipping %s: %s (%s)", pid, v.reason, v.detail[:300])
    logging.info("static pool: %d of %d programs valid", len(self.valid), len(ids))
    if not self.valid:
      raise ValueError(f"No program of the static pool (static_pool.path="
                       f"{self.cfg.path!r}) passed validation: {self.skipped}. Fix the "
                       "programs, or set static_pool.validate=False to play them anyway.")

  def order(self, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s permutation of the valid programs."""
    if self._order is None or self._order[0] != epoch:
      rng = np.random.default_rng([self.seed, epoch, 0x5354])
      self._order = (epoch, rng.permutation(len(self.valid)))
    return self._order[1]

  def draw(self, it: int, num_envs: int, pool) -> list[Drawn]:
    del it
    self.prepare(pool)
    out = []
    for _ in range(num_envs):
      if self.pos >= len(self.valid):
        self.epoch, self.pos = self.epoch + 1, 0
      pid = self.valid[int(self.order(self.epoch)[self.pos])]
      self.pos += 1
      out.append(Drawn(self.programs[pid], self.name, pid))
    return out

  def observe(self, it: int, rewards: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    del it, rewards, mask
    return {"static_pool/programs": len(self.valid or ()),
            "static_pool/skipped": len(self.skipped), "static_pool/epoch": self.epoch,
            "static_pool/drawn": self.epoch * len(self.valid or ()) + self.pos}

  def state(self) -> dict[str, Any]:
    return {"valid": self.valid, "skipped": self.skipped, "epoch": self.epoch,
            "pos": self.pos}

  def restore(self, state: Mapping[str, Any]) -> None:
    valid, skipped = state["valid"], dict(state["skipped"])
    if not self.cfg.path:  # built-in ids written before the renames
      new = envs.programs.RENAMED
      valid = None if valid is None else [new.get(pid, pid) for pid in valid]
      skipped = {new.get(pid, pid): why for pid, why in skipped.items()}
    if valid is not None:
      missing = sorted(set(valid) - set(self.programs))
      if missing:
        raise ValueError(f"The checkpoint's static pool holds programs that "
                         f"static_pool.path={self.cfg.path!r} no longer has: {missing[:8]}. "
                         "Resume with the pool the run started from.")
      valid = list(valid)
    self.valid, self.skipped = valid, skipped
    self.epoch, self.pos, self._order = int(state["epoch"]), int(state["pos"]), None


# ---------------------------------------------------------------------------------------------
# RLVE.


class RLVESource:
  """Reasoning-gym problems under the RLVE difficulty controller (docs/METHOD.md §7).

  Each slot's problem: a family drawn uniformly, a level uniformly from its window, a
  problem seed, all from ``(seed, iteration, slot)``; the slot's plays share the problem.
  After the plays the controller counts the attempts at each family's top level and
  moves its window (:class:`spade_jax.selfplay.rlve.DifficultyController`).
  """

  name = "rlve"

  def __init__(self, cfg: rlve_lib.RLVEConfig, *, setting: str, seed: int = 0):
    if setting != "games":
      raise ValueError(f"selfplay.env_source='rlve' writes single-turn games programs; got "
                       f"selfplay.setting={setting!r}. Set selfplay.setting='games'.")
    for f in cfg.families:
      rlve_lib.check_family(f, cfg.scoring)
    self.cfg, self.seed = cfg, seed
    cap = lambda f: (rlve_lib.max_level(f) if cfg.max_level < 0
                     else min(cfg.max_level, rlve_lib.max_level(f)))
    self.controller = rlve_lib.DifficultyController(
        {f: cap(f) for f in cfg.families}, attempts=cfg.attempts,
        accuracy=cfg.accuracy, window=cfg.window, start_level=cfg.start_level)
    # Questions of the held-out evaluation problems: never trained on.
    self.held_out = {t["question"] for t in rlve_lib.held_out_tasks(
        cfg.families, cfg.start_level, cfg.held_out_items, cfg.held_out_seed)}
    self.current: list[dict[str, Any]] = []  # per slot: the family and level it plays

  def draw(self, it: int, num_envs: int, pool) -> list[Drawn]:
    del pool
    out, self.current = [], []
    families = self.cfg.families
    for e in range(num_envs):
      rng = np.random.default_rng([self.seed, it, e, 0x524C])
      family = families[int(rng.integers(len(families)))]
      level = self.controller.draw(family, rng)
      for _ in range(256):  # a held-out question is drawn again
        task = rlve_lib.generate(family, level, int(rng.integers(2 ** 31)))
        if task["question"] not in self.held_out:
          break
      else:
        raise ValueError(f"rlve: 256 draws of {family!r} at level {level} all hit the "
                         f"{len(self.held_out)} held-out questions; lower "
                         "rlve.held_out_items or widen the level.")
      self.current.append({"family": family, "level": level})
      out.append(Drawn(rlve_lib.task_program(task, self.cfg.scoring), self.name,
                       f"{family}/{level}/{task['seed']}"))
    return out

  def observe(self, it: int, rewards: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    del it
    for e, task in enumerate(self.current):
      solved = [bool(r >= 1.0) for r, m in zip(rewards[e], mask[e]) if m]
      self.controller.record(task["family"], task["level"], solved)
    raised = self.controller.update()
    bounds = {f: self.controller.bounds(f) for f in self.cfg.families}
    metrics = {"rlve/raised": len(raised),
               "rlve/level_mean": float(np.mean([t["level"] for t in self.current]))
               if self.current else 0.0,
               "rlve/high_mean": float(np.mean([h for _, h in bounds.values()])),
               "rlve/high_max": max(h for _, h in bounds.values())}
    for f, (low, high) in bounds.items():
      metrics[f"rlve/{f}/low"], metrics[f"rlve/{f}/high"] = low, high
    return metrics

  def state(self) -> dict[str, Any]:
    return {"controller": self.controller.state(), "current": self.current}

  def restore(self, state: Mapping[str, Any]) -> None:
    self.controller.restore(state["controller"])
    self.current = [dict(t) for t in state["current"]]


# ---------------------------------------------------------------------------------------------
# The switch.

# Name -> factory(*, static_pool, rlve, setting, validation, seed) -> EnvSource, or None for
# the designer (SelfPlay's own design stage).
ENV_SOURCES: Registry = Registry("env source", field="selfplay.env_source")
ENV_SOURCES.register("designer", lambda **_: None)
ENV_SOURCES.register("static_pool", lambda *, static_pool, setting, validation, seed, **_:
                     StaticPool(static_pool, setting=setting, validation=validation,
                                seed=seed))
ENV_SOURCES.register("rlve", lambda *, rlve, setting, seed, **_:
                     RLVESource(rlve, setting=setting, seed=seed))


def make_env_source(name: str, *, static_pool: StaticPoolConfig | None = None,
                    rlve: rlve_lib.RLVEConfig | None = None, setting: str = "games",
                    validation: envs.ValidationConfig | None = None,
                    seed: int = 0) -> EnvSource | None:
  """The env source ``name`` of :data:`ENV_SOURCES` (None for the designer)."""
  return ENV_SOURCES[name](static_pool=static_pool or StaticPoolConfig(),
                           rlve=rlve or rlve_lib.RLVEConfig(), setting=setting,
                           validation=validation or envs.ValidationConfig(setting=setting),
                           seed=seed)


__all__ = ["Drawn", "ENV_SOURCES", "EnvSource", "JSONL_KEYS", "RLVESource", "StaticPool",
           "StaticPoolConfig", "load_programs", "make_env_source"]
