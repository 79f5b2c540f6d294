r"""SPADE tool-use recipe (REFERENCE §6): Qwen3-4B, Qwen3-8B or Qwen3-30B-A3B.

  python -m launch.train --workdir=gs://BUCKET/runs/tools_8b \
      --config=experiments/configs/tool_use.py:model=qwen3_8b,mesh=v5p-64
  python -m launch.train --workdir=/tmp/tools_smoke --config=experiments/configs/tool_use.py:smoke

Arguments as in games.py (model: qwen3_4b, qwen3_8b, qwen3_30b_a3b).
"""

import dataclasses

import ml_collections

from spade_jax.models import get_preset

from experiments.configs import common

# Per model: rollouts, envs, plays, hinted plays, regeneration = credit delay, designer
# tokens (REFERENCE §6); KL 0.005 for all.
MODELS = {
    "qwen3_4b": dict(iterations=500, envs=16, plays=16, hinted=4, regen=32,
                     designer_tokens=16_384),
    "qwen3_8b": dict(iterations=400, envs=24, plays=8, hinted=16, regen=8,
                     designer_tokens=20_000),
    "qwen3_30b_a3b": dict(iterations=400, envs=24, plays=8, hinted=16, regen=8,
                          designer_tokens=16_384),
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, model="qwen3_8b", mesh="v5p-64", ckpt="", ablation="",
                       smoke=False)
  common.choose("model", a.model, MODELS)
  common.choose("ablation", a.ablation, common.ABLATIONS)
  m = MODELS[a.model]
  moe = "a3b" in a.model
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.iterations = m["iterations"]
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
  c.loss = dict(common.LOSS, kl_coef=0.005)
  c.optimizer = dict(common.OPTIMIZER)
  c.sampling = dict(common.SAMPLING)
  c.designer_sampling = dict(common.SAMPLING)
  c.hint_sampling = dict(common.HINT_SAMPLING)
  c.selfplay = dict(
      setting="tool_use", skills=(), num_envs=m["envs"], plays=m["plays"],
      hinted_plays=m["hinted"], max_turns=25, agent_turn_tokens=8192,
      designer_new_tokens=m["designer_tokens"], designer_prompt_tokens=12_288,
      skills_per_regen=3, designer_resamples=5, regen_every=m["regen"], hint_source="policy",
      hint_tokens=1024, llm_validator=True, judge_tokens=2048, designer_thinking=True,
      agent_thinking=True)
  c.rewards = dict(variant="blend", credit_window=m["regen"])
  c.corpus = dict(source="embedded", max_words=4000)
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
