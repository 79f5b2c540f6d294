r"""The mechanism experiment: does regret-driven design help a pretrained model?

  python -m experiments.mechanism.run [--arms=spade,static --seeds=0,1,2]   # everything
  python -m launch.train --config=experiments/configs/mechanism.py:arm=spade,seed=0 \
      --workdir=$SPADE_JAX_CACHE/mechanism/runs/spade-0                  # one arm by hand

Arguments (`get_config("arm=spade,seed=0[,iterations=..,eval_every=..,smoke]")`):
  arm: one of the four arms, each from the same warm start with the same agent budget
    (`envs` x (`plays` unhinted + `hinted` hinted) plays an iteration, `iterations`):
    `spade` (the designer writes the programs and trains on the blend reward, the paper),
    `static` (a fixed pool of every seen family at every level; only the agent trains),
    `solve_rate` (the designer rewarded by the agent's solve rate), `frozen_designer` (the
    designer writes but never trains); or `warm_start`, the SFT run that makes that start
    from SmolLM2-135M-Instruct (`experiments/mechanism/warm_start.py` runs it: `steps`,
    `designer_rows`, `agent_rows`, `sft_lr`, `train_slips`: the scripted player's slips
    trained too, off by default).
  seed: the run's seed.
  iterations, eval_every: the run's length and how often the `families` suite plays
    (also at the start: once for every run, `shared_start`), on fixed seeds: the seen
    families at the designers' level and at a harder one, the held-out family at three
    levels; `eval_samples` plays at T 0.6 per seed (success and pass@k) and one greedy play.
  warm_start: the warm start's HF directory (default: the cache's,
    `$SPADE_JAX_CACHE/mechanism/warm_start/hf`).
  pool_max_level: the `static` arm's pool holds the seen families at levels 0 to this
    (default all five; `pool_max_level=1` is the pool the agent can win, with `run.py
    --tag` so it runs beside the arm's own runs).
  pool_slack: the `static` pool's `SLACK` knob (the wrong answers a game allows) at this
    value in every program instead of each level's own (default -1: the level's). A named
    change for the learner: at `pool_slack=0` a game is won only by answering right the
    first time, so naming answers until one is accepted cannot win it (the evaluation
    keeps each level's own games).
  aggregation: the arms' `loss.aggregation` (default "token_mean", the library's; losing
    plays tend to hold more agent tokens than winning ones, so a token mean pushes the
    sampled tokens down on net; "seq_mean_token_mean" weighs every play alike).
  shuffle: a control for the learner (`selfplay.shuffle_agent_advantages`): the agent's
    advantages permuted among its rows each iteration, so an update keeps its size and
    values but loses its signal.
  programs: what the designer writes: `library` (default; a short program that imports a
    seen family from the sandbox module `families` and sets its knobs,
    `spade_jax.envs.families.library`) or `full` (the whole family program, up to 1,448
    tokens; ~4x the warm start's and the designer's compute). Also the static pool's form.
  smoke: a tiny random model (`experiments/configs/common.tiny_hf_checkpoint`) instead of
    SmolLM2, one iteration, two envs, a one-item evaluation (the test suite runs it).
"""

from __future__ import annotations

import json
import os

import ml_collections

from experiments.configs import common
from experiments.mechanism import common as mech
from experiments.mechanism import data
from spade_jax.envs.families import FAMILIES, NUM_LEVELS, library
from spade_jax.rl.loss import AGGREGATIONS

# The evaluation's size is its cost: a play took ~5.7 s here beside the SFT (140 plays of the
# warm start's items in 793 s), so 25 items x 4 seeds x (4 sampled + 1 greedy) would be
# ~45 min an evaluation; 2 seeds x (2 + 1) is ~14 min.
ARGS = dict(arm="spade", seed=0, iterations=20, eval_every=10, envs=4, plays=4, hinted=2,
            lr=1e-5, eval_seeds=2, eval_samples=2, warm_start="", programs="library",
            steps=32, designer_rows=160, agent_rows=480, sft_lr=1e-4, train_slips=False,
            shared_start=True, pool_max_level=NUM_LEVELS - 1, pool_slack=-1,
            aggregation="token_mean",
            shuffle=False, smoke=False)
ROLES = ("warm_start",) + mech.ARMS


def eval_items(smoke: bool = False) -> str:
  """The `families` suite's items: seen families at the designers' level and a harder one,
  the held-out family at three levels."""
  if smoke:
    return f"{mech.HELD_OUT}:0"
  seen = ",".join(f"{n}:{mech.DESIGNER_LEVEL},{n}:{mech.HARDER_LEVEL}" for n in mech.seen())
  return ",".join([seen] + [f"{mech.HELD_OUT}:{lv}" for lv in mech.HELD_OUT_LEVELS])


def starting_items() -> str:
  """The warm start's measured levels: the seen families at the designers' level, the
  held-out family at three levels."""
  return ",".join([f"{n}:{mech.DESIGNER_LEVEL}" for n in mech.seen()] +
                  [f"{mech.HELD_OUT}:{lv}" for lv in mech.HELD_OUT_LEVELS])


def static_pool_path(programs: str = "library", max_level: int = NUM_LEVELS - 1,
                     slack: int = -1) -> str:
  """The static arm's pool (JSONL in the cache): every seen family at every level up to
  ``max_level`` (all of them by default), as the designers write programs (``programs``,
  see `experiments/mechanism/data.render`); ``slack`` >= 0 sets every program's `SLACK`
  knob (-1 keeps each level's)."""
  if not 0 <= max_level < NUM_LEVELS:
    raise ValueError(f"pool_max_level={max_level}; expected a level in 0..{NUM_LEVELS - 1}.")
  if slack < -1:
    raise ValueError(f"pool_slack={slack}; expected -1 (each level's own) or a number of "
                     "wrong answers >= 0.")

  def knobs(name: str, level: int) -> dict[str, int]:
    values = FAMILIES[name].levels(level)
    if slack >= 0:
      values["SLACK"] = slack
    FAMILIES[name].resolve(**values)  # a value outside the knob's range says so here
    return values

  rows = [{"id": f"{n}:{lv}", "program": data.render(programs, FAMILIES[n], knobs(n, lv))}
          for n in mech.seen() for lv in range(max_level + 1)]
  name = (f"static_pool_{programs}" + ("" if max_level == NUM_LEVELS - 1 else
                                       f"_to{max_level}") +
          ("" if slack < 0 else f"_slack{slack}"))
  return common.write_once(os.path.join(mech.cache_dir(), f"{name}.jsonl"),
                           "".join(json.dumps(r) + "\n" for r in rows))


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, **ARGS)
  common.choose("arm", a.arm, {r: 0 for r in ROLES})
  common.choose("programs", a.programs, {p: 0 for p in data.PROGRAMS})
  common.choose("aggregation", a.aggregation, {n: 0 for n in AGGREGATIONS})
  full = a.programs == "full"
  if a.arm == "warm_start":
    start = common.tiny_hf_checkpoint() if a.smoke else mech.BASE
    start = start if start.startswith("gguf:") else "hf:" + start
  else:
    hf = a.warm_start or os.path.join(mech.warm_start_dir(a.smoke), "hf")
    start = "hf:" + hf
  c = ml_collections.ConfigDict()
  c.seed = a.seed
  c.iterations = a.steps if a.arm == "warm_start" else a.iterations
  c.checkpoint_every = 4 if a.arm == "warm_start" else 1
  c.keep_checkpoints = 2
  c.tokenizer = ""  # the checkpoint's
  c.model = dict(init_from=start, param_dtype="float32", compute_dtype="float32",
                 remat="full" if full else "none")
  c.mesh = dict(data=1, fsdp=-1, tensor=1, expert=1, rules="fsdp")
  # A designer row: a prompt of up to 2,048 tokens and the program (a library program
  # ~130 tokens, a full one up to 1,536).
  # An update trains 1-2 packed rows of agent plays (more with designer rows): batches of
  # one row, cut to a multiple of 256 columns, compute the same update as [8, 2,304]
  # batches (token-mean loss) at a fraction of the cost (`static-0` ran [8, 2,304]).
  c.train = dict(batch_size=1, seq_len=3584 if full else 2304, num_microbatches=1,
                 width_bucket=256, logprob_chunk=256, old_logps="recompute",
                 objective="grpo", share_prefix=16)
  c.loss = dict(common.LOSS, kl_coef=0.0, aggregation=a.aggregation)
  c.optimizer = dict(common.OPTIMIZER, learning_rate=a.lr)
  c.sampling = dict(common.SAMPLING)
  c.designer_sampling = dict(common.SAMPLING)
  c.hint_sampling = dict(common.HINT_SAMPLING)
  skills = mech.skills()
  c.selfplay = dict(
      setting=mech.SETTING, skills=skills, num_envs=a.envs, plays=a.plays,
      hinted_plays=a.hinted, max_turns=mech.MAX_TURNS,
      agent_turn_tokens=mech.AGENT_TURN_TOKENS,
      designer_new_tokens=mech.DESIGNER_NEW_TOKENS[a.programs],
      # Two slots a skill (2 of the 4 skills an iteration): designer rewards are centred
      # by skill, and a skill's only slot would be centred on itself (advantage 0).
      designer_prompt_tokens=mech.DESIGNER_PROMPT_TOKENS, skills_per_regen=max(1, a.envs // 2),
      designer_resamples=1, regen_every=1, hint_source="program", fill_from_pool=True,
      designer_thinking=False, agent_thinking=False, shuffle_agent_advantages=a.shuffle)
  c.rewards = dict(variant="blend", credit_window=1, invalid_penalty=-1.0)
  c.corpus = dict(source="embedded", max_words=400)
  c.memory = dict(capacity=200, num_exemplars=1, negatives=False)
  c.sandbox = dict(num_workers=4, modules=() if full else (library.__name__,))
  c.validation = dict(random_episodes=2, random_steps=3)
  if not full:  # library programs import the families (`from families import ...`)
    c.validation.allowed_imports = library.PROGRAM_IMPORTS
  c.static_pool = dict(path="", key="", validate=True)
  # The arms' evaluation before training is one computation (same weights, config and keys):
  # `run.start_eval` makes it once unless `shared_start=False`.
  c.eval = dict(common.EVAL, suites="families", every=a.eval_every,
                at_start=not a.shared_start)
  c.eval.overrides = dict(families=dict(
      families=eval_items(a.smoke), seeds=a.eval_seeds, samples=a.eval_samples,
      temperature=common.SAMPLING["temperature"], top_p=common.SAMPLING["top_p"],
      top_k=common.SAMPLING["top_k"], greedy=True, max_new_tokens=mech.AGENT_TURN_TOKENS,
      # The longest scripted play is 1,123 tokens. The KV cache is ~46 KB a token (float32),
      # so 128 plays of 3,072 at once took 15 GB and were killed beside the trainer.
      max_len=2048, concurrency=32))
  if a.arm == "static":
    c.selfplay.env_source = "static_pool"
    c.static_pool.path = static_pool_path(a.programs, a.pool_max_level, a.pool_slack)
  elif a.arm == "solve_rate":
    c.rewards.variant = "solve_rate"
  elif a.arm == "frozen_designer":
    c.selfplay.train_designer = False
  elif a.arm == "warm_start":
    # 32 full batches of 8 x 2,304 packed SFT tokens.
    c.train.update(objective="sft", batch_size=8, num_microbatches=4, width_bucket=0)
    c.loss = dict(aggregation="token_mean", kl_coef=0.0, entropy_coef=0.0)
    c.optimizer = dict(common.OPTIMIZER, learning_rate=a.sft_lr, weight_decay=0.0)
    # What the SFT rows are (not a run section: warm_start.py takes it off before the
    # config reaches the library, and keeps it in the run's config.json).
    c.sft = dict(programs=a.programs, designer_rows=a.designer_rows, agent_rows=a.agent_rows,
                 designer_levels=mech.DESIGNER_KNOB_LEVELS, agent_levels=(0, 1, 2, 2, 3, 4),
                 slip=0.2, slip_hinted=0.1, train_slips=a.train_slips,
                 hinted_frac=0.3, designer_eval=24, agent_eval_seeds=4,
                 agent_eval_items=starting_items(),
                 designer_prompt_tokens=mech.DESIGNER_PROMPT_TOKENS)
  if a.smoke:
    c.iterations = min(a.steps, 2) if a.arm == "warm_start" else 1
    c.checkpoint_every = 1
    c.train.update(batch_size=8, seq_len=4096, num_microbatches=1)  # 8 test devices
    c.selfplay.update(num_envs=2, plays=2, hinted_plays=1, designer_new_tokens=32,
                      skills_per_regen=1, max_turns=4)
    c.sandbox.num_workers = 2
    c.eval.every = 1
    c.eval.overrides.families.update(seeds=1, samples=2, max_new_tokens=8, max_len=1024)
    if a.arm == "warm_start":
      c.sft.update(designer_rows=2, agent_rows=4, designer_eval=1, agent_eval_seeds=1,
                   agent_eval_items=f"arithmetic_chain:2,{mech.HELD_OUT}:0")
  return c
