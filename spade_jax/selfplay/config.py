"""The shape of one self-play iteration (`SelfPlayConfig`), the floor every stage reads."""

from __future__ import annotations

import dataclasses

from spade_jax import designer as dz
from spade_jax import envs
from spade_jax.selfplay.baselines import ENV_SOURCES


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
  """Shape of one iteration.

  Attributes:
    setting: a name in `envs.SETTINGS` ("games" or "tool_use").
    env_source: where the slots' programs come from, a name in
      `selfplay.baselines.ENV_SOURCES`: "designer" (SPADE: the policy writes them),
      "static_pool" (the `static_pool` section; the built-in programs by default) or
      "rlve" (the `rlve` section: reasoning-gym tasks under a difficulty controller).
      The baselines train the agent only.
    skills: skills to design for (empty: every skill of the setting).
    num_envs: env slots E (one designer sample per slot per regeneration).
    plays: unhinted plays N per env and iteration.
    hinted_plays: hinted plays M per env at its regeneration step, on the unhinted seeds
      (0: none, as the baselines; the designer needs >= 1 for its regret).
    max_turns: agent turns per episode.
    agent_turn_tokens: new tokens per agent turn.
    designer_new_tokens: new tokens per designer program.
    designer_prompt_tokens: token budget of the designer prompt (chat markup included);
      the document is cut to fit, never the rest. 0: no budget.
    skills_per_regen: skills designed for at one regeneration, rotating round-robin
      (reference 3 of 6 for 24 envs; default 2, so the default 4 envs give each skill the
      two slots its centred designer reward needs); 0: every skill each time.
    designer_resamples: times a slot's designer sample is redrawn after failing
      validation (reference 5).
    regen_every: iterations between designer regenerations of all slots.
    hint_source: "policy" (reference: the model reads the program and writes a hint) or
      "program" (the program's own hint()).
    hint_tokens: new tokens of a policy-written hint.
    hint_leak_check: drop a hint that spells out the episode's solution() actions (the
      hinted play then runs unhinted).
    matched_hint_seeds: hinted plays reuse the unhinted plays' seeds, so both regret arms
      see the same instances; False draws their own seeds (the reference).
    fill_from_pool: slots without a valid designer program play a built-in program
      instead (never credited to the designer).
    train_designer: put credited designer samples in the GRPO batch.
    no_corpus: ablation: designer prompts without a document.
    dynamic_sampling: leave out of the gradient the agent groups (an env slot's unhinted
      plays) whose terminal outcomes are all equal (DAPO; counted in
      `agent/uniform_groups_dropped`); they still count in win rates and regret.
    shuffle_agent_advantages: a control, not the method: each iteration the agent rows'
      advantages are permuted among them (seeded by the run seed and the iteration), so an
      update has the same size and the same values but no relation to the plays; compared
      with a run without it, it tells what the learner's signal does from what updates of
      that size do. The designer's rewards are untouched.
    llm_validator: the policy judges each program that passed validation and rejects
      those it answers `\\boxed{no}` for (reason "judge"; docs/METHOD.md §5, tool use).
    judge_tokens: new tokens of a judgement.
    designer_thinking: the designer and hint writer's chat prefix lets the model think
      (False: Qwen3's non-thinking mode, an empty think block in front of each turn).
    agent_thinking: the same for the agent.
    overlap_play: step an episode's env as soon as its turn ends, while the sampler
      decodes the other episodes (same transcripts as lock step; see
      `selfplay.episodes.run_episodes` and experiments/benchmarks/rollout.py).
    play_cohorts: with `overlap_play`, k >= 2 splits the agent's engine rows into k
      lock-step cohorts run out of phase: one decodes while the others' envs step
      (`sampling.schedule(overlap=k)`); 0 lets every row rejoin on its own.
    design_ahead: the first designer sample of each slot for the next regeneration is
      drawn during the plays of the iteration before it, on the agent's engine rows
      (`episodes.run_episodes_with_requests`), so the designer's decoding overlaps the
      agent's plays and env steps. Those samples come from the weights before that
      iteration's update (their policy version is recorded; truncated IS corrects the
      lag like any stale sample), and their prompts are rebuilt at the regeneration: a
      slot whose prompt changed meanwhile (the memory took the credited cohort) is drawn
      again then, so every program answers the prompt the reference would show.
      Resamples of invalid programs run at the regeneration as usual. A run's last
      iteration draws them too (checkpointed: a run extended later plays them, as an
      uninterrupted one would). Needs `designer_sampling` equal to `sampling`. False:
      the reference's order.
    agent_system: the agent's system turn: "default" (the setting's agent prompt,
      `designer.agent_system_prompt`), "none" (no system turn: the task's text is the
      whole prompt) or any other text, used as it is.
  """

  setting: str = "games"
  env_source: str = "designer"
  skills: tuple[str, ...] = ()
  num_envs: int = 4
  plays: int = 2
  hinted_plays: int = 2
  max_turns: int = 3
  agent_turn_tokens: int = 48
  designer_new_tokens: int = 256
  designer_prompt_tokens: int = 0
  skills_per_regen: int = 2
  designer_resamples: int = 5
  regen_every: int = 1
  hint_source: str = "policy"
  hint_tokens: int = 128
  hint_leak_check: bool = True
  matched_hint_seeds: bool = True
  fill_from_pool: bool = True
  train_designer: bool = True
  no_corpus: bool = False
  dynamic_sampling: bool = False
  shuffle_agent_advantages: bool = False
  llm_validator: bool = False
  judge_tokens: int = 256
  designer_thinking: bool = True
  agent_thinking: bool = True
  overlap_play: bool = False
  play_cohorts: int = 0
  design_ahead: bool = False
  agent_system: str = "default"

  def __post_init__(self):
    object.__setattr__(self, "skills", tuple(self.skills))
    envs.SETTINGS.check(self.setting)
    dz.HINT_SOURCES.check(self.hint_source)
    ENV_SOURCES.check(self.env_source)
    for name in ("num_envs", "plays", "max_turns", "regen_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"selfplay.{name} must be >= 1; got {getattr(self, name)}.")
    if self.design_ahead and self.env_source != "designer":
      raise ValueError(f"selfplay.design_ahead draws the designer's next programs, but "
                       f"selfplay.env_source={self.env_source!r} has no designer; set "
                       "design_ahead=False for the baselines.")
    if self.env_source == "designer" and self.hinted_plays < 1:
      raise ValueError(f"selfplay.hinted_plays={self.hinted_plays}: the designer's regret "
                       "needs hinted plays; set it >= 1 (only the baselines, "
                       "selfplay.env_source='static_pool' or 'rlve', may use 0).")
    if self.play_cohorts == 1 or self.play_cohorts < 0:
      raise ValueError(f"selfplay.play_cohorts={self.play_cohorts}: use 0 (rows rejoin on "
                       "their own) or k >= 2 cohorts.")
    if self.play_cohorts and not self.overlap_play:
      raise ValueError(f"selfplay.play_cohorts={self.play_cohorts} needs "
                       "selfplay.overlap_play=True (cohorts are an overlapped schedule).")
    for name in ("hinted_plays", "skills_per_regen", "designer_resamples",
                 "designer_prompt_tokens"):
      if getattr(self, name) < 0:
        raise ValueError(f"selfplay.{name} must be >= 0; got {getattr(self, name)}.")


def overlap(cfg: SelfPlayConfig) -> bool | int:
  """The episode runner's `overlap`: lock step, rows rejoining alone, or k cohorts."""
  return cfg.play_cohorts or cfg.overlap_play  # play_cohorts > 0 implies overlap_play
