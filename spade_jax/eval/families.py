"""Procedural env families: the policy plays held-out games as the reasoning agent.

Each item is a (family, difficulty level) of :mod:`spade_jax.envs.families`, played from
``seeds`` fixed reset seeds (``first_seed + i``), ``samples`` times each, greedy by
default. The default items are the held-out family (``families.HELD_OUT``) at every level
and every seen family at its two hardest levels (``hard`` and ``hardest``).

A play is token for token an unhinted self-play episode: the agent's system prompt of
the games setting and the reset observation open it, each assistant turn is the
generated ids, the env steps on their decoded text, and the next observation follows as
a user turn (``chat.continuation``). The program runs in the sandbox pool with
``max_turns`` set to the family's own turn budget (``TURNS``). A play is solved when the
env terminates it with reward >= 1; its reward is the clipped reward of that last step
(0 when it did not terminate). A play whose transcript would pass ``max_len`` tokens
ends with outcome "context" (not solved); one the sandbox ends (a crash, a timeout)
ends with the failure as outcome.

Scores: ``held_out/success`` (the held-out family's plays), ``harder/success`` (seen
families at levels >= 3, "hard" and "hardest"), ``success/<family>/<level>`` per item,
and ``failed`` (plays the sandbox ended: the env's fault, not the policy's). With
``samples`` > 1 also ``pass@k/<family>/<level>`` and ``held_out/pass@k`` (a seed counts
when any of its ``samples`` plays wins); with ``greedy`` also one arg-max play per seed,
scored as ``greedy/<family>/<level>`` and ``held_out/greedy``. ``repeats`` and
``repeats/<family>/<level>``: of the sampled plays' answers after each play's first, the
share that repeat an answer the same play gave before (`repeated_answers`; in these
games an answer the env already turned down). Records: one per play
(family, level, seed, sample, greedy, outcome, solved, turns, max_turns, reward, tokens,
actions).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Sequence

from absl import logging

from spade_jax import envs, sandbox
from spade_jax.designer import agent_system_prompt
from spade_jax.envs.families import FAMILIES, HELD_OUT, LEVEL_NAMES, NUM_LEVELS
from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, register
from spade_jax.eval.policy import converse, sample_keys
from spade_jax.sampling import Output, Turn
from spade_jax.sandbox.worker.actions import program_action

SETTING = "games"
HARD = LEVEL_NAMES.index("hard")  # seen families from this level up count as "harder"


def default_items() -> tuple[tuple[str, int], ...]:
  """The held-out family at every level, then each seen family at levels >= ``HARD``."""
  out = [(HELD_OUT, level) for level in range(NUM_LEVELS)]
  out += [(name, level) for name in FAMILIES if name != HELD_OUT
          for level in range(HARD, NUM_LEVELS)]
  return tuple(out)


def _level(text: str, field: str, entry: str) -> int:
  text = text.strip()
  if text in LEVEL_NAMES:
    return LEVEL_NAMES.index(text)
  try:
    level = int(text)
  except ValueError:
    level = -1
  if not 0 <= level < NUM_LEVELS:
    raise ValueError(f"{field}: {entry!r} has level {text!r}; expected 0..{NUM_LEVELS - 1} "
                     f"or one of {list(LEVEL_NAMES)}, alone or as a range like 3-4.")
  return level


def parse_items(spec: str, field: str = "families.families") -> tuple[tuple[str, int], ...]:
  """(family, level) pairs of a spec like ``"knights_knaves:0-4,guess_number:3-4"``.

  Each comma-separated entry is ``FAMILY`` (every level), ``FAMILY:LEVEL`` or
  ``FAMILY:LOW-HIGH`` (inclusive); levels are 0..4 or names (``easiest`` .. ``hardest``).
  "" is :func:`default_items`.

  Raises:
    ValueError: naming ``field`` for an unknown family, a bad level or range, or a pair
      given twice.
  """
  if not spec.strip():
    return default_items()
  out: list[tuple[str, int]] = []
  for entry in (e.strip() for e in spec.split(",")):
    if not entry:
      continue
    name, colon, levels = (s.strip() for s in entry.partition(":"))
    if name not in FAMILIES:
      raise ValueError(f"{field}: unknown env family {name!r} in {entry!r}; expected one of "
                       f"{sorted(FAMILIES)}.")
    if not colon:
      low, high = 0, NUM_LEVELS - 1
    else:
      lo_text, dash, hi_text = levels.partition("-")
      low = _level(lo_text, field, entry)
      high = _level(hi_text, field, entry) if dash else low
      if high < low:
        raise ValueError(f"{field}: {entry!r} has an empty level range {levels!r}; write "
                         "it low-high, e.g. 3-4.")
    for level in range(low, high + 1):
      if (name, level) in out:
        raise ValueError(f"{field}: {name} level {level} is given twice in {spec!r}.")
      out.append((name, level))
  if not out:
    raise ValueError(f"{field}={spec!r} names no family; leave it empty for the default "
                     "items or write e.g. knights_knaves:0-4,guess_number:3-4.")
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class FamiliesConfig(SuiteConfig):
  """``families``: greedy plays of procedural env families at chosen difficulty levels.

  ``limit`` caps the seeds per item (it wins over ``seeds`` when smaller); ``samples``
  plays each seed that many times (distinct only at temperature > 0).

  Attributes:
    families: which items, e.g. ``"knights_knaves:0-4,guess_number:3-4"`` (see
      :func:`parse_items`); "" is the held-out family at levels 0-4 and every seen one at
      levels 3-4.
    seeds: reset seeds per item: ``first_seed, first_seed + 1, ...``.
    first_seed: the first reset seed (fixed, so every evaluation plays the same games).
    max_len: transcript tokens at most; a play that needs more ends unsolved ("context").
    concurrency: env instances (sandbox workers) alive at once; plays run in waves of it.
    greedy: also play each seed once at temperature 0 (scores ``greedy/...``).
  """

  max_new_tokens: int = 48
  batch_size: int = 64
  families: str = ""
  seeds: int = 8
  first_seed: int = 10_000
  max_len: int = 4096
  concurrency: int = 128
  greedy: bool = False

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.families, str):  # a list from a config file: join it
      object.__setattr__(self, "families", ",".join(self.families))
    for name in ("seeds", "max_len", "concurrency"):
      if getattr(self, name) < 1:
        raise ValueError(f"families.{name}={getattr(self, name)!r}; expected >= 1.")
    if self.first_seed < 0:
      raise ValueError(f"families.first_seed={self.first_seed}; expected >= 0.")
    if self.max_new_tokens >= self.max_len:
      raise ValueError(f"families.max_new_tokens={self.max_new_tokens} leaves no room for "
                       f"the prompt in max_len={self.max_len}; raise max_len.")
    self.items()

  def items(self) -> tuple[tuple[str, int], ...]:
    """The (family, level) items, in the order they are played."""
    return parse_items(self.families)

  def seed_list(self) -> list[int]:
    """Each item's reset seeds."""
    n = min(self.seeds, self.limit) if self.limit else self.seeds
    return [self.first_seed + i for i in range(n)]


@dataclasses.dataclass
class Play:
  """One game: its item, seed and sample, and its transcript (ids the policy saw)."""

  family: str
  level: int
  seed: int
  sample: int
  tokens: list[int] = dataclasses.field(default_factory=list)
  actions: list[str] = dataclasses.field(default_factory=list)
  max_turns: int = 0
  turns: int = 0
  reward: float = 0.0
  outcome: str = "running"

  @property
  def solved(self) -> bool:
    return self.outcome == "solved"


def _max_turns(family: str, level: int) -> int:
  fam = FAMILIES[family]
  return fam.max_turns(**fam.levels(level))


def _check(cfg: FamiliesConfig) -> None:
  """Renders every item's program, so a family that cannot build fails before a model
  loads."""
  for family, level in cfg.items():
    try:
      FAMILIES[family].program_at(level)
      _max_turns(family, level)
    except ValueError as e:
      raise ValueError(f"families.families: {family} level {level} does not render: "
                       f"{e}") from e


def _step(play: Play, res, chat, cfg: FamiliesConfig) -> list[int] | None:
  """Applies an env step result; returns the next turn's ids, or None when the play ends."""
  if not res.ok:
    play.outcome = res.reason or "crash"
    return None
  obs, reward, terminated, truncated, _ = res.value
  if not math.isfinite(reward):
    play.outcome = "contract"
    return None
  if terminated:
    play.reward = max(-1.0, min(1.0, float(reward)))
    play.outcome = "solved" if reward >= 1.0 else "terminated"
    return None
  if truncated:
    play.outcome = "truncated"
    return None
  nxt = chat.continuation(obs)
  if len(play.tokens) + len(nxt) + cfg.max_new_tokens > cfg.max_len:
    play.outcome = "context"
    return None
  play.tokens.extend(nxt)
  return nxt


def _wave(policy, chat, cfg: FamiliesConfig, pool, plays: Sequence[Play], keys,
          system: str, on_end: Callable[[], None]) -> None:
  """Plays ``plays`` to the end on fresh env instances, then releases them."""
  handles = []
  try:
    # Plays come item by item; each item's instances start together (one program, one
    # turn budget).
    for (family, level), group in itertools.groupby(plays, lambda p: (p.family, p.level)):
      group = list(group)
      handles += envs.start(pool, [FAMILIES[family].program_at(level)] * len(group),
                            SETTING, group[0].max_turns)
    resets = pool.reset_many(handles, seeds=[p.seed for p in plays])
    live, first = [], []
    for j, (p, res) in enumerate(zip(plays, resets)):
      if not res.ok:
        p.outcome = res.reason or "crash"
        on_end()
        continue
      obs, info = res.value
      p.tokens = list(chat.prompt(system, obs, tools=info.get("tools")))
      if len(p.tokens) + cfg.max_new_tokens > cfg.max_len:
        p.outcome = "context"
        on_end()
        continue
      live.append(j)
      first.append(Turn(list(p.tokens), cfg.max_new_tokens))

    def respond(outputs: dict[int, Output]) -> dict[int, Turn | None]:
      idx = [live[c] for c in outputs]
      actions = []
      for j, (toks, _, _) in zip(idx, outputs.values()):
        p = plays[j]
        p.tokens.extend(toks)
        p.turns += 1
        actions.append(chat.vocab.decode(toks))
        p.actions.append(cfg.clip(actions[-1]))
      results = pool.step_many([handles[j] for j in idx], actions)
      nxt: dict[int, Turn | None] = {}
      for c, j, res in zip(outputs, idx, results):
        p = plays[j]
        ids = _step(p, res, chat, cfg)
        if ids is not None and p.turns >= p.max_turns:
          p.outcome, ids = "max_turns", None
        nxt[c] = None if ids is None else Turn(ids, cfg.max_new_tokens)
        if ids is None:
          on_end()
      return nxt

    converse(policy, cfg, first, [keys[j] for j in live], respond, max_len=cfg.max_len)
  finally:
    pool.release(handles)


def play(policy, chat, cfg: FamiliesConfig, pool,
         progress: Callable[[int, int], None] | None = None) -> list[Play]:
  """Plays every item's seeds ``cfg.samples`` times each.

  Args:
    policy: a ``Sampler`` or an ``eval.ScriptedPolicy``.
    chat: the agent's ``models.ChatTemplate``.
    cfg: the suite's config.
    pool: the ``sandbox.EnvPool`` the programs run in.
    progress: called with (plays ended, total).

  Returns:
    Plays in item-major order: item, then seed, then sample. Play ``k`` of the
    ``(item, seed)`` pair with flat index ``i`` samples with key ``i, k`` of
    ``sample_keys(cfg.seed, ...)``.
  """
  seeds = cfg.seed_list()
  plays = [Play(family, level, seed, k, max_turns=_max_turns(family, level))
           for family, level in cfg.items() for seed in seeds for k in range(cfg.samples)]
  keys = sample_keys(cfg.seed, len(plays) // cfg.samples, cfg.samples)
  system = agent_system_prompt(SETTING)
  done = [0]

  def on_end() -> None:
    done[0] += 1
    if progress is not None:
      progress(done[0], len(plays))

  for start in range(0, len(plays), cfg.concurrency):
    stop = start + cfg.concurrency
    _wave(policy, chat, cfg, pool, plays[start:stop], keys[start:stop], system, on_end)
  return plays


@register("families", FamiliesConfig, needs="offline (procedural)",
          description="procedural env families as the agent: held-out family and harder "
                      "levels of the seen ones, success rate",
          check=_check)
def run_families(policy, chat, cfg: FamiliesConfig, *, pool=None, progress=None
                 ) -> SuiteResult:
  own = pool is None
  pool = sandbox.EnvPool(sandbox.SandboxConfig()) if own else pool
  try:
    plays = play(policy, chat, cfg, pool, progress)
    greedy = (play(policy, chat, dataclasses.replace(cfg, samples=1, temperature=0.0), pool)
              if cfg.greedy else [])
  finally:
    if own:
      pool.close()
  failed = [p for p in plays + greedy if p.outcome in sandbox.FAILURES]
  if failed:
    logging.warning("eval families: the sandbox ended %d of %d plays (%s); they count as "
                    "unsolved.", len(failed), len(plays) + len(greedy),
                    sorted({p.outcome for p in failed}))
  per_item: dict[tuple[str, int], list[float]] = {}
  for p in plays:
    per_item.setdefault((p.family, p.level), []).append(float(p.solved))
  held = [v for (f, _), vs in per_item.items() if f == HELD_OUT for v in vs]
  harder = [v for (f, lv), vs in per_item.items() if f != HELD_OUT and lv >= HARD
            for v in vs]
  scores: dict[str, float] = {}
  if held:
    scores["held_out/success"] = mean(held)
  if harder:
    scores["harder/success"] = mean(harder)
  for (family, level), vs in per_item.items():
    scores[f"success/{family}/{level}"] = mean(vs)
  if cfg.samples > 1:
    _add_rate(scores, "pass@k", _pass_at_k(plays))
  if greedy:
    _add_rate(scores, "greedy", {(p.family, p.level, p.seed): float(p.solved)
                                 for p in greedy})
  scores["failed"] = mean([float(p.outcome in sandbox.FAILURES) for p in plays + greedy])
  counts: dict[tuple[str, int], list[int]] = {}
  for p in plays:
    n = counts.setdefault((p.family, p.level), [0, 0])
    for i, v in enumerate(repeated_answers(p.actions)):
      n[i] += v
  if counts:
    scores["repeats"] = (sum(r for r, _ in counts.values()) /
                         max(sum(a for _, a in counts.values()), 1))
    for (family, level), (r, a) in counts.items():
      scores[f"repeats/{family}/{level}"] = r / max(a, 1)
  records = [{"family": p.family, "level": p.level, "seed": p.seed, "sample": p.sample,
              "greedy": g, "outcome": p.outcome, "solved": p.solved, "turns": p.turns,
              "max_turns": p.max_turns,
              "reward": p.reward, "tokens": len(p.tokens), "actions": p.actions}
             for g, ps in ((False, plays), (True, greedy)) for p in ps]
  return SuiteResult(scores, records)


def repeated_answers(actions: Sequence[str]) -> tuple[int, int]:
  """(answers after the first that repeat an earlier answer of the same play, answers
  after the first). An answer is what the env's `step` receives for the turn
  (`program_action` in "boxed" mode: the last `\\boxed{}`, else the text, stripped).
  """
  seen, repeated = set(), 0
  for action in actions:
    answer = program_action(action, "boxed")
    repeated += answer in seen
    seen.add(answer)
  return repeated, max(len(actions) - 1, 0)


def _pass_at_k(plays: Sequence[Play]) -> dict[tuple[str, int, int], float]:
  """(family, level, seed) -> 1.0 when any play of that seed was solved."""
  out: dict[tuple[str, int, int], float] = {}
  for p in plays:
    key = (p.family, p.level, p.seed)
    out[key] = max(out.get(key, 0.0), float(p.solved))
  return out


def _add_rate(scores: dict[str, float], name: str,
              per_seed: dict[tuple[str, int, int], float]) -> None:
  """``<name>/<family>/<level>`` per item and ``held_out/<name>`` from per-seed wins."""
  per_item: dict[tuple[str, int], list[float]] = {}
  for (family, level, _), v in per_seed.items():
    per_item.setdefault((family, level), []).append(v)
  held = [v for (f, _), vs in per_item.items() if f == HELD_OUT for v in vs]
  if held:
    scores[f"held_out/{name}"] = mean(held)
  for (family, level), vs in per_item.items():
    scores[f"{name}/{family}/{level}"] = mean(vs)
