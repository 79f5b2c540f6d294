"""Tiny self-play run on CPU: the default of `bash launch/run.sh`.

Run:
  python -m launch.train --config=experiments/configs/tiny.py --workdir=/tmp/spade_tiny

A 2-layer byte-level model, 4 env slots, 2 unhinted + 2 hinted plays per env,
3 turns per episode, 3 iterations. An untrained model writes invalid programs:
their slots play built-in programs so every stage of the data path runs.
"""

import dataclasses

import ml_collections

from spade_jax.models import get_preset


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the tiny config. `arg` may be "smoke" for an even smaller run."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.iterations = 3
  c.checkpoint_every = 1
  c.keep_checkpoints = 3

  c.model = dataclasses.asdict(get_preset("tiny"))
  c.mesh = dict(data=-1, fsdp=1, tensor=1, rules="fsdp")
  c.train = dict(batch_size=12, seq_len=1024, num_microbatches=1)
  c.loss = dict(eps_low=0.2, eps_high=0.28, kl_coef=0.0, aggregation="token_mean")
  c.optimizer = dict(learning_rate=1e-4, weight_decay=0.1, b1=0.9, b2=0.98)
  c.sampling = dict(temperature=1.0, top_p=1.0, top_k=0)

  c.selfplay = dict(
      setting="games", skills=("logical deduction", "mathematical reasoning"),
      num_envs=4, plays=2, hinted_plays=2, max_turns=3, agent_turn_tokens=32,
      designer_new_tokens=192, designer_prompt_tokens=640, regen_every=1,
      hint_source="program", fill_from_pool=True)
  c.rewards = dict(variant="blend", credit_window=1, invalid_penalty=-1.0)
  c.corpus = dict(source="embedded", max_words=200)
  c.memory = dict(capacity=256)
  c.sandbox = dict(num_workers=2)
  c.validation = dict(random_episodes=2, random_steps=3)

  if arg == "smoke":
    c.iterations = 2
    c.train.batch_size = 8
    c.train.seq_len = 768
    c.selfplay.num_envs = 2
    c.selfplay.max_turns = 2
    c.selfplay.agent_turn_tokens = 24
    c.selfplay.designer_new_tokens = 64
    c.selfplay.designer_prompt_tokens = 256
  elif arg:
    raise ValueError(f"Unknown tiny config variant {arg!r}; valid: '' or 'smoke'.")
  return c
