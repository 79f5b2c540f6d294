"""Tiny self-play run on CPU: the default of `bash launch/run.sh`.

Run:
  python -m launch.train --config=experiments/configs/tiny.py --workdir=/tmp/spade_tiny

A 2-layer Qwen3-shaped model with a 4,096-id BPE vocabulary (`experiments/tokenizers`),
4 env slots, 2 unhinted + 2 hinted plays per env, 3 turns per episode, 3 iterations,
through the paper's data path (policy-written hints, one resample of invalid programs,
blend reward, truncated importance sampling). An untrained model writes invalid programs:
their slots play built-in programs so every stage of the data path runs.
"""

import dataclasses
import os

import ml_collections

from spade_jax.models import get_preset

TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "tokenizers", "tiny_bpe_4k")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the tiny config. `arg` may be "smoke" for an even smaller run."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.iterations = 3
  c.checkpoint_every = 1
  c.keep_checkpoints = 3
  c.tokenizer = TOKENIZER

  c.model = dataclasses.asdict(get_preset("tiny", vocab_size=4096))
  c.mesh = dict(data=-1, fsdp=1, tensor=1, rules="fsdp")
  c.train = dict(batch_size=16, seq_len=1536, num_microbatches=1, share_prefix=16)
  c.loss = dict(eps_low=0.2, eps_high=0.28, kl_coef=0.0, aggregation="token_mean",
                tis_cap=2.0)
  c.optimizer = dict(learning_rate=1e-4, weight_decay=0.1, b1=0.9, b2=0.98)
  # Sampling per role, the reference's values: the agent (`sampling`) and the designer
  # at T 0.6 / top-p 0.95 / top-k 20, the hint writer at T 0.3.
  c.sampling = dict(temperature=0.6, top_p=0.95, top_k=20)
  c.designer_sampling = dict(temperature=0.6, top_p=0.95, top_k=20)
  c.hint_sampling = dict(temperature=0.3, top_p=0.95, top_k=20)

  c.selfplay = dict(
      setting="games", skills=("logical deduction", "mathematical reasoning"),
      num_envs=4, plays=2, hinted_plays=2, max_turns=3, agent_turn_tokens=32,
      designer_new_tokens=192, designer_prompt_tokens=1280, skills_per_regen=2,
      designer_resamples=1, regen_every=1, hint_source="policy", hint_tokens=64,
      fill_from_pool=True, overlap_play=False, play_cohorts=0, design_ahead=False,
      dynamic_sampling=False)
  c.rewards = dict(variant="blend", credit_window=1, invalid_penalty=-1.0)
  c.corpus = dict(source="embedded", max_words=200, decontaminate=False)
  c.memory = dict(capacity=200)
  c.sandbox = dict(num_workers=2)
  c.validation = dict(random_episodes=2, random_steps=3)
  # Held-out evaluation, off: e.g. --config.eval.suites=reasoning_gym --config.eval.every=1
  # --config.eval.limit=2.
  c.eval = dict(suites="", every=0, limit=0, samples=0, max_new_tokens=0, batch_size=0,
                data_dir="", seed=0)
  # The contamination audit: flag (default) | drop | off (spade_jax.selfplay.audit).
  c.audit = dict(mode="flag", suites="", min_matches=1, hint_min_share=0.6,
                 hint_min_actions=3)

  if arg == "smoke":
    c.iterations = 2
    c.train.batch_size = 8
    c.selfplay.num_envs = 2
    c.selfplay.max_turns = 2
    c.selfplay.agent_turn_tokens = 24
    c.selfplay.designer_new_tokens = 64
    c.selfplay.hint_tokens = 32
  elif arg:
    raise ValueError(f"Unknown tiny config variant {arg!r}; valid: '' or 'smoke'.")
  return c
