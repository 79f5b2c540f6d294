r"""One arm of the mechanism experiment, as a training config.

  python -m experiments.mechanism.run --arm=spade --seed=0          # builds what it needs
  python -m launch.train --config=experiments/mechanism/config.py:arm=spade,seed=0 \
      --workdir=$SPADE_JAX_CACHE/mechanism/runs/spade-0             # the same run by hand

Arms (``arm=``), all from the same warm start (``warm_start.py``) with the same agent-play
budget per iteration (``NUM_ENVS`` x ``PLAYS`` unhinted plays, the same iterations):

* ``spade``: the designer writes the programs and is trained on the blend reward (the paper).
* ``static``: a fixed pool of the seen families at each difficulty level (levels 0-4), drawn
  without replacement; only the agent trains (REFERENCE §7's static pool baseline).
* ``solve_rate``: as ``spade``, the designer rewarded by the agent's solve rate instead.
* ``frozen_designer``: as ``spade``, the designer writes but is never trained
  (``selfplay.train_designer=False``).

Every ``EVAL_EVERY`` iterations the ``families`` eval suite plays the held-out family at
every level and the seen families at levels 3-4, greedily on fixed seeds.

``smoke`` shrinks the run to two iterations of the smoke warm start's tiny model (the test
suite runs it).
"""

from __future__ import annotations

import json
import os

import ml_collections

from experiments.configs import common as recipes
from experiments.mechanism import common

ITERATIONS = 30
NUM_ENVS, PLAYS, HINTED_PLAYS = 8, 4, 4
EVAL_EVERY, EVAL_SEEDS = 5, 4
# A 10M model warm-started at 2e-3 moves too little at the paper's 1e-6 (a 4B model's rate).
LEARNING_RATE = 5e-5


def static_pool_path() -> str:
  """The static arm's pool (JSONL): every seen family at every difficulty level."""
  from spade_jax.envs.families import FAMILIES, NUM_LEVELS  # pylint: disable=g-import-not-at-top
  path = os.path.join(common.cache_dir(), "static_pool.jsonl")
  rows = [{"id": f"{name}:{level}", "program": FAMILIES[name].program_at(level)}
          for name in common.seen() for level in range(NUM_LEVELS)]
  text = "".join(json.dumps(r) + "\n" for r in rows)
  if not os.path.isfile(path) or open(path).read() != text:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)
  return path


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """The config of ``arm=<name>,seed=<n>[,smoke][,warm_start=DIR]`` (``warm_start``: a
  build directory or HF directory to start from instead of the cache's warm start)."""
  a = recipes.parse_arg(arg, arm="spade", seed=0, smoke=False, warm_start="")
  if a.arm not in common.ARMS:
    raise ValueError(f"Unknown arm {a.arm!r}; expected one of {list(common.ARMS)}.")
  hf = (common.warm_start_hf(a.warm_start) if a.warm_start
        else os.path.join(common.warm_start_dir(a.smoke), "hf"))
  c = ml_collections.ConfigDict()
  c.seed = int(a.seed)
  c.iterations = 2 if a.smoke else ITERATIONS
  c.checkpoint_every = 1
  c.keep_checkpoints = 2
  c.tokenizer = ""  # the checkpoint's
  c.model = dict(init_from="hf:" + hf, param_dtype="float32", compute_dtype="float32",
                 remat="full")
  c.mesh = dict(data=-1, fsdp=1, tensor=1, rules="fsdp")
  c.train = dict(batch_size=8, seq_len=2560, num_microbatches=4 if not a.smoke else 1)
  c.loss = dict(recipes.LOSS, kl_coef=0.0)
  c.optimizer = dict(recipes.OPTIMIZER, learning_rate=LEARNING_RATE)
  c.sampling = dict(recipes.SAMPLING)
  c.designer_sampling = dict(recipes.SAMPLING)
  c.hint_sampling = dict(recipes.HINT_SAMPLING)
  skills = common.skills()
  c.selfplay = dict(
      setting=common.SETTING, skills=skills, num_envs=NUM_ENVS, plays=PLAYS,
      hinted_plays=HINTED_PLAYS, max_turns=common.MAX_TURNS,
      agent_turn_tokens=common.AGENT_TURN_TOKENS, designer_new_tokens=1300,
      designer_prompt_tokens=common.DESIGNER_PROMPT_TOKENS, skills_per_regen=len(skills),
      designer_resamples=1, regen_every=1, hint_source="program", fill_from_pool=True,
      designer_thinking=False, agent_thinking=False)
  c.rewards = dict(variant="blend", credit_window=1, invalid_penalty=-1.0)
  c.corpus = dict(source="embedded", max_words=400)
  # No negative example: with it a prompt shows two programs, which do not fit the 1,024-token
  # budget even with every method body elided (the warm start's designer rows show none).
  c.memory = dict(capacity=200, num_exemplars=common.NUM_EXEMPLARS, negatives=False)
  c.sandbox = dict(num_workers=4)
  c.validation = dict(random_episodes=2, random_steps=3)
  c.static_pool = dict(path="", key="", validate=True)
  c.eval = dict(recipes.EVAL, suites="families", every=EVAL_EVERY, limit=EVAL_SEEDS,
                max_new_tokens=common.AGENT_TURN_TOKENS)
  if a.arm == "static":
    c.selfplay.env_source = "static_pool"
    c.static_pool.path = static_pool_path()
  elif a.arm == "solve_rate":
    c.rewards.variant = "solve_rate"
  elif a.arm == "frozen_designer":
    c.selfplay.train_designer = False
  if a.smoke:
    c.train.seq_len = 1536  # a designer row: a 1,024-token prompt and 48 new tokens
    c.selfplay.num_envs = 4
    c.selfplay.plays = 2
    c.selfplay.hinted_plays = 2
    c.selfplay.designer_new_tokens = 48
    c.selfplay.max_turns = 4
    c.eval.every = 1
    c.eval.limit = 1
  return c
