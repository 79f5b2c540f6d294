"""The host side of self-play's iteration state: env slots, designer samples awaiting
credit, the designs drawn ahead, and their checkpoint JSON.

Every value here is frozen: a stage returns a new `HostState` rather than changing the
one it was given. The device side (train state, regret buffer) lives beside it in
`SelfPlay`; the corpus position, the environment memory and a baseline's env source are
stores with their own checkpoint state (`SelfPlay.host_state` gathers them all).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from spade_jax import envs


@dataclasses.dataclass(frozen=True)
class Slot:
  """An env slot: the program it plays and where that came from."""

  source: str | None = None
  origin: str = "none"          # "designer" | "pool" | an env source's name | "none"
  skill: int = -1               # index into the setting's skills; -1 not credited
  doc_id: str = ""
  written: int = -1             # iteration its designer sample was written
  hint: str | None = None       # policy-written hint for the current program

  @classmethod
  def from_pool(cls, programs: Sequence[str], e: int, it: int) -> Slot:
    """Slot `e`'s built-in program when it is filled from the pool at iteration `it`."""
    return cls(programs[(it + e) % len(programs)], "pool", -1)


@dataclasses.dataclass(frozen=True)
class DesignSample:
  """A designer sample waiting for its delayed credit."""

  slot: int
  skill: int
  doc_id: str
  tokens: list[int]
  logps: list[float]
  prompt_len: int
  program: str | None
  reason: str | None            # None: the program was valid and installed
  iteration: int
  attempt: int = 0
  policy_version: int = 0
  # How its env failed while played, if it did: "timeout" (a call ran past the sandbox's
  # deadline) or "crash" (any other sandbox failure). The program is then replaced at
  # once, so its credit reads this and `failure_raw`, never the slot's later state.
  failure: str | None = None
  failure_raw: float = 0.0      # its env's raw score in the iteration it failed
  # The contamination audit's checks of this sample (its program, document, hints and
  # plays), in the `audit` record format of `selfplay.audit`; None: nothing checked.
  audit: dict[str, Any] | None = None

  @property
  def failed(self) -> bool:
    return self.failure is not None

  @classmethod
  def from_json(cls, saved: dict[str, Any]) -> DesignSample:
    """A checkpointed sample. Older checkpoints hold `failed` instead of `failure`: their
    failed samples were credited as crashes, and still are; those without `audit` had
    nothing checked."""
    saved = dict(saved)
    if "failed" in saved:
      saved.setdefault("failure", "crash" if saved.pop("failed") else None)
    return cls(**saved)


@dataclasses.dataclass(frozen=True)
class Ahead:
  """The first designer sample of each slot for regeneration `iteration`, drawn during
  the plays of the iteration before it (`SelfPlayConfig.design_ahead`).

  Attributes:
    iteration: the regeneration they are for.
    version: the policy version (train step) they were sampled with.
    prompts: each slot's prompt ids as they stood when drawn.
    docs: each slot's document (`Document` fields) or None.
    tokens, logps, finished: each slot's sample.
  """

  iteration: int
  version: int
  prompts: list
  docs: list
  tokens: list
  logps: list
  finished: list

  @classmethod
  def of(cls, iteration: int, version: int, prompts: list, docs: list, gen) -> Ahead:
    """From the drawn `Generation` (its arrays as plain JSON-able lists)."""
    return cls(iteration, version, prompts,
               [dataclasses.asdict(d) if d else None for d in docs],
               [list(map(int, t)) for t in gen.tokens],
               [list(map(float, l)) for l in gen.logprobs],
               [bool(f) for f in gen.finished])

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HostState:
  """What an iteration carries to the next on the host (besides the stores).

  Attributes:
    slots: each env slot's program.
    fresh: slots given a new program since the last play (they play hinted too).
    pending: designer samples waiting for their credit.
    ahead: the next regeneration's designs drawn ahead, or None.
  """

  slots: tuple[Slot, ...]
  fresh: tuple[bool, ...]
  pending: tuple[DesignSample, ...] = ()
  ahead: Ahead | None = None

  @classmethod
  def empty(cls, num_envs: int) -> HostState:
    return cls((Slot(),) * num_envs, (False,) * num_envs)

  def replace(self, **changes) -> HostState:
    for name in ("slots", "fresh", "pending"):
      if name in changes:
        changes[name] = tuple(changes[name])
    return dataclasses.replace(self, **changes)

  def with_slots(self, new: dict[int, Slot]) -> HostState:
    """Slots `new` installed (and fresh): a program replaced or cleared."""
    return self.replace(slots=[new.get(e, s) for e, s in enumerate(self.slots)],
                        fresh=[f or e in new for e, f in enumerate(self.fresh)])

  def to_json(self) -> dict[str, Any]:
    return {"slots": [dataclasses.asdict(s) for s in self.slots],
            "fresh": [bool(f) for f in self.fresh],
            "pending": [dataclasses.asdict(p) for p in self.pending],
            "ahead": self.ahead.to_json() if self.ahead is not None else None}

  @classmethod
  def from_json(cls, host: dict[str, Any]) -> HostState:
    ahead = host.get("ahead")
    return cls(tuple(Slot(**s) for s in host["slots"]),
               tuple(bool(f) for f in host["fresh"]),
               tuple(DesignSample.from_json(p) for p in host["pending"]),
               Ahead(**ahead) if ahead is not None else None)


def skill_name(setting: str, index: int) -> str:
  """The name of skill `index` of `setting` ("" for -1, a slot not credited)."""
  return envs.SKILLS[setting][index] if index >= 0 else ""
