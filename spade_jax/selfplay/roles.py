"""The policy's three roles in self-play: each role's sampling rule, keys and chat.

The designer and the hint writer (and the judge, who samples as the hint writer) share
the designer's chat template; the agent has its own (`SelfPlayConfig.designer_thinking`,
`agent_thinking`). Call n of an (iteration, role) sampler draws with
fold_in(fold_in(fold_in(key(seed), it), role), n), so a resumed run samples as an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from spade_jax import designer as dz
from spade_jax.models import ChatTemplate
from spade_jax.sampling import Sampler, SamplingConfig
from spade_jax.selfplay.config import SelfPlayConfig

ROLES = ("designer", "hint", "agent")


@dataclasses.dataclass(frozen=True)
class RoleSampling:
  """One sampling rule per role: the designer, the hint writer and the agent."""

  designer: SamplingConfig
  hint: SamplingConfig
  agent: SamplingConfig

  @classmethod
  def of(cls, sampling: SamplingConfig | RoleSampling) -> RoleSampling:
    return sampling if isinstance(sampling, RoleSampling) else cls(sampling, sampling, sampling)


class Roles:
  """Role -> sampler, keys and chat, for one run's model and seed."""

  def __init__(self, cfg: SelfPlayConfig, vocab, sampling: SamplingConfig | RoleSampling,
               seed: int, trainer):
    self.cfg = cfg
    self.vocab = vocab
    self.sampling = RoleSampling.of(sampling)
    self.chat = ChatTemplate(vocab, thinking=cfg.designer_thinking)  # designer + hints
    self.agent_chat = ChatTemplate(vocab, thinking=cfg.agent_thinking)
    self.seed = seed
    self.base_key = jax.random.key(seed)
    self.model_cfg, self.mesh, self.rules = trainer.model_cfg, trainer.mesh, trainer.rules

  def key(self, it: int, role: str) -> jax.Array:
    """The key of role `role`'s sampler at iteration `it`."""
    return jax.random.fold_in(jax.random.fold_in(self.base_key, it), ROLES.index(role))

  def sampler(self, params: Any, it: int, role: str) -> Sampler:
    """Role `role`'s policy at iteration `it` with weights `params`."""
    return Sampler(params, self.model_cfg, getattr(self.sampling, role), self.key(it, role),
                   mesh=self.mesh, rules=self.rules)

  def play_seed(self, *parts: int) -> int:
    """A 63-bit seed from the run's seed and `parts` (iteration, slot, play, ...)."""
    return int(np.random.SeedSequence([self.seed, *parts]).generate_state(1)[0] >> 1)

  def count_tokens(self, text: str) -> int:
    """Tokens of `text` as a designer prompt (chat markup included)."""
    return len(self.chat.prompt(None, text))

  def agent_system(self) -> str | None:
    """The agent's system turn (`SelfPlayConfig.agent_system`)."""
    if self.cfg.agent_system == "default":
      return dz.agent_system_prompt(self.cfg.setting)
    return None if self.cfg.agent_system == "none" else self.cfg.agent_system

  def sampling_metrics(self) -> dict[str, float]:
    """Each role's sampling rule, as metrics."""
    out = {}
    for role in ROLES:
      rule = getattr(self.sampling, role)
      out.update({f"sampling/{role}/temperature": rule.temperature,
                  f"sampling/{role}/top_p": rule.top_p, f"sampling/{role}/top_k": rule.top_k})
    return out
