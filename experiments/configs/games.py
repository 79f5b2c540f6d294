r"""SPADE games recipe (docs/METHOD.md §6): Qwen3-4B / 30B-A3B Instruct-2507, or Qwen3-8B thinking.

  python -m launch.train --workdir=gs://BUCKET/runs/games_4b \
      --config=experiments/configs/games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64
  python -m launch.train --dry_run \
      --config=experiments/configs/games.py:model=qwen3_30b_a3b_instruct_2507,mesh=v5p-64
  python -m launch.train --workdir=/tmp/games_smoke --config=experiments/configs/games.py:smoke

Arguments: model (a preset: qwen3_4b_instruct_2507, qwen3_30b_a3b_instruct_2507, qwen3_8b),
mesh (a slice: v5p-64, v5p-128, ..., or cpu), ckpt (the starting Hugging Face checkpoint;
default $SPADE_JAX_CHECKPOINTS/<HF name>), ablation (docs/METHOD.md §9: no_corpus, no_memory,
no_designer_training, static_pool, two_skills, learning_potential, solve_rate), smoke (the
same recipe shrunk to a CPU run from a tiny random Hugging Face checkpoint).
"""

import ml_collections

from experiments.configs import common

# Per model: KL coefficient and designer tokens (docs/METHOD.md §6).
MODELS = {
    "qwen3_4b_instruct_2507": dict(kl=0.0, designer_tokens=16_384),
    "qwen3_30b_a3b_instruct_2507": dict(kl=0.0, designer_tokens=16_384),
    "qwen3_8b": dict(kl=0.005, designer_tokens=20_000),
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, model="qwen3_4b_instruct_2507", mesh="v5p-64", ckpt="",
                       ablation="", smoke=False)
  common.choose("model", a.model, MODELS)
  m = MODELS[a.model]
  return common.recipe(a, setting="games", iterations=400, envs=24, plays=8, hinted=16,
                       regen=4, kl=m["kl"], designer_tokens=m["designer_tokens"],
                       doc_words=6000)
