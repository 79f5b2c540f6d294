"""The hint stage: what the hinted plays are told (docs/METHOD.md §1.4).

`write_hints`: at a regeneration the policy reads each new program and writes its hint
(`hint_source="policy"`; its own sampling, the hint role). `episode_hints`: the hint each
hinted play is shown, from an instance of its own; with `hint_leak_check` a hint that
spells out the episode's solution() actions is dropped (the play then runs unhinted).
The run's contamination `Auditor` checks each hinted play's hint as written against the
held-out items and, where solution() was fetched, for literal, answer and sequence leaks;
under `audit.mode="drop"` a flagged hint is dropped too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.selfplay.audit import Auditor, Note
from spade_jax.selfplay.config import SelfPlayConfig
from spade_jax.selfplay.roles import Roles
from spade_jax.selfplay.state import HostState

Policy = Callable[[int, str], Any]  # (iteration, role) -> a sampler


def write_hints(cfg: SelfPlayConfig, roles: Roles, host: HostState, it: int,
                policy: Policy) -> tuple[HostState, dict[str, float]]:
  """The policy reads each fresh slot's program and writes its hint.

  Returns:
    (the host state with the fresh slots' hints, the stage's sampling metrics).
  """
  live = [e for e, s in enumerate(host.slots) if s.source and host.fresh[e]]
  if not live:
    return host, {}
  prompts = [roles.chat.prompt(None, dz.hint_prompt(host.slots[e].source, cfg.setting))
             for e in live]
  gen = policy(it, "hint")(prompts, cfg.hint_tokens)
  slots = list(host.slots)
  for e, toks in zip(live, gen.tokens):
    slots[e] = dataclasses.replace(slots[e], hint=dz.clean_hint(roles.vocab.decode(toks)))
  return host.replace(slots=slots), {
      "sampling/hint/tokens": sum(len(t) for t in gen.tokens),
      "sampling/hint/finished_rate": float(np.mean(gen.finished))}


Pair = tuple[int, int]  # (slot, seed)


def episode_hints(cfg: SelfPlayConfig, pool, host: HostState, pairs: list[Pair],
                  auditor: Auditor | None = None
                  ) -> tuple[dict[Pair, str | None], dict[Pair, Note]]:
  """Hint of each hinted (slot, seed), from instances of their own, and its audit note.

  The program's hint() and solution() run on a fresh instance reset with the play's
  seed, never on the live episode (they may change its state). A hint that spells out
  the solution's actions is dropped when `hint_leak_check`; one the auditor would drop
  is dropped too.

  Returns:
    (each pair's hint, each checked pair's note: none when the auditor is off).
  """
  slots = host.slots
  program = cfg.hint_source == "program"
  if not pairs or not (program or cfg.hint_leak_check):
    return _audited({(e, s): (slots[e].hint, slots[e].hint, None) for e, s in pairs},
                    auditor)
  handles = envs.start(pool, [slots[e].source for e, _ in pairs], cfg.setting, cfg.max_turns)
  try:
    resets = pool.reset_many(handles, seeds=[s for _, s in pairs])
    ok = [h for h, r in zip(handles, resets) if r.ok]
    sols = dict(zip(map(id, ok), pool.call_many(ok, "solution")
                    if cfg.hint_leak_check else [None] * len(ok)))
    own = dict(zip(map(id, ok), pool.call_many(ok, "hint") if program else
                   [None] * len(ok)))
  finally:
    pool.release(handles)
  out = {}
  for (e, s), h in zip(pairs, handles):
    sol, raw = sols.get(id(h)), own.get(id(h))
    actions = sol.value if sol is not None and sol.ok and isinstance(sol.value, list) else None
    text = (raw.value if raw is not None and raw.ok else None) if program else slots[e].hint
    out[(e, s)] = (dz.finalize_hint(text, cfg.hint_source, actions).text, text, actions)
  return _audited(out, auditor)


def _audited(hints: dict[Pair, tuple], auditor: Auditor | None
             ) -> tuple[dict[Pair, str | None], dict[Pair, Note]]:
  """(final hints, notes) from each pair's (final hint, hint as written, solution actions):
  the written hint (cleaned) is checked, and a final hint the auditor drops becomes None."""
  if auditor is None or not auditor.on:
    return {k: v[0] for k, v in hints.items()}, {}
  out, notes = {}, {}
  for k, (final, written, actions) in hints.items():
    text = dz.clean_hint(written) if written is not None else None
    if text is None:
      out[k] = final
      continue
    note = notes[k] = auditor.hint(text, [str(a) for a in actions] if actions else None)
    out[k] = None if note.drop else final
  return out, notes
