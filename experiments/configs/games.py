r"""SPADE games recipe (REFERENCE §6): Qwen3-4B / 30B-A3B Instruct-2507, or Qwen3-8B thinking.

  python -m launch.train --workdir=gs://BUCKET/runs/games_4b \
      --config=experiments/configs/games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64
  python -m launch.train --dry_run \
      --config=experiments/configs/games.py:model=qwen3_30b_a3b_instruct_2507,mesh=v5p-64
  python -m launch.train --workdir=/tmp/games_smoke --config=experiments/configs/games.py:smoke

Arguments: model (a preset: qwen3_4b_instruct_2507, qwen3_30b_a3b_instruct_2507, qwen3_8b),
mesh (a slice: v5p-64, v5p-128, ..., or cpu), ckpt (the starting Hugging Face checkpoint;
default $SPADE_JAX_CHECKPOINTS/<HF name>), ablation (REFERENCE §9: no_corpus, no_memory,
no_designer_training, static_pool, two_skills, learning_potential, solve_rate), smoke (the
same recipe shrunk to a CPU run from a tiny random Hugging Face checkpoint).
"""

import dataclasses

import ml_collections

from spade_jax.models import get_preset

from experiments.configs import common

# Per model: KL coefficient and designer tokens (REFERENCE §6). Every role uses the
# model's own chat format: the Instruct-2507 models never think, Qwen3-8B thinks in both
# roles (`selfplay.*_thinking=False` would put Qwen3's empty think block in front instead).
MODELS = {
    "qwen3_4b_instruct_2507": dict(kl=0.0, designer_tokens=16_384),
    "qwen3_30b_a3b_instruct_2507": dict(kl=0.0, designer_tokens=16_384),
    "qwen3_8b": dict(kl=0.005, designer_tokens=20_000),
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, model="qwen3_4b_instruct_2507", mesh="v5p-64", ckpt="",
                       ablation="", smoke=False)
  common.choose("model", a.model, MODELS)
  common.choose("ablation", a.ablation, common.ABLATIONS)
  m = MODELS[a.model]
  moe = "a3b" in a.model
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.iterations = 400
  c.checkpoint_every = 4
  c.keep_checkpoints = 3
  c.tokenizer = ""
  # The preset's architecture (checked against the checkpoint's config.json), fp32 master
  # weights, bf16 compute, full rematerialisation.
  c.model = dict(dataclasses.asdict(get_preset(a.model)),
                 init_from="hf:" + (a.ckpt or common.default_checkpoint(a.model)),
                 param_dtype="float32", compute_dtype="bfloat16", remat="full")
  c.mesh = common.mesh_preset(a.mesh, moe)
  # One 32,768-token row per device per micro-batch; overflow rows open further batches
  # that accumulate into the same update.
  devices = common.SLICES.get(a.mesh, 8)
  c.train = dict(batch_size=4 * devices, seq_len=32_768, num_microbatches=4,
                 logprob_chunk=1024, old_logps="recompute")
  c.loss = dict(common.LOSS, kl_coef=m["kl"])
  c.optimizer = dict(common.OPTIMIZER)
  c.sampling = dict(common.SAMPLING)
  c.designer_sampling = dict(common.SAMPLING)
  c.hint_sampling = dict(common.HINT_SAMPLING)
  c.selfplay = dict(
      setting="games", skills=(), num_envs=24, plays=8, hinted_plays=16, max_turns=25,
      agent_turn_tokens=8192, designer_new_tokens=m["designer_tokens"],
      designer_prompt_tokens=12_288, skills_per_regen=3, designer_resamples=5,
      regen_every=4, hint_source="policy", hint_tokens=1024,
      designer_thinking=True, agent_thinking=True)
  c.rewards = dict(variant="blend", credit_window=4)
  c.corpus = dict(source="embedded", max_words=6000)
  c.memory = dict(capacity=200)
  c.sandbox = dict(num_workers=16)
  c.validation = dict()
  # Held-out evaluation, off by default: e.g. --config.eval.suites=reasoning_gym,bfcl
  # --config.eval.every=50 logs eval/<suite>/<metric> during training.
  c.eval = dict(common.EVAL)
  common.apply(c, common.ABLATIONS[a.ablation])
  if a.smoke:
    common.smoke(c, moe)
  return c
