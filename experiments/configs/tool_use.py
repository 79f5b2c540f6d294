r"""SPADE tool-use recipe (docs/METHOD.md §6): Qwen3-4B, Qwen3-8B or Qwen3-30B-A3B.

  python -m launch.train --workdir=gs://BUCKET/runs/tools_8b \
      --config=experiments/configs/tool_use.py:model=qwen3_8b,mesh=v5p-64
  python -m launch.train --workdir=/tmp/tools_smoke --config=experiments/configs/tool_use.py:smoke

Arguments as in games.py (model: qwen3_4b, qwen3_8b, qwen3_30b_a3b).
"""

import ml_collections

from experiments.configs import common

# Per model: rollouts, envs, plays, hinted plays, regeneration = credit delay, designer
# tokens (docs/METHOD.md §6); KL 0.005 for all.
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
  m = MODELS[a.model]
  return common.recipe(a, setting="tool_use", iterations=m["iterations"], envs=m["envs"],
                       plays=m["plays"], hinted=m["hinted"], regen=m["regen"], kl=0.005,
                       designer_tokens=m["designer_tokens"], doc_words=4000,
                       llm_validator=True)
