r"""Baselines (docs/METHOD.md §6-§7) in the SPADE loop: agent only, same GRPO, sampler and sandbox.

  python -m launch.train --workdir=gs://BUCKET/runs/rlve_4b \
      --config=experiments/configs/baselines.py:kind=rlve,model=qwen3_4b_instruct_2507,mesh=v5p-64
  python -m launch.train --workdir=gs://BUCKET/runs/pool_8b \
      --config=experiments/configs/baselines.py:kind=static_pool,model=qwen3_8b,mesh=v5p-64,pool=/data/pool.jsonl
  python -m launch.train --workdir=/tmp/rlve_smoke \
      --config=experiments/configs/baselines.py:kind=rlve,smoke
  python -m launch.train --workdir=/tmp/pool_smoke \
      --config=experiments/configs/baselines.py:kind=static_pool,smoke

Arguments: kind ("rlve": reasoning-gym tasks under the RLVE difficulty controller, 16 envs x
16 plays, one single-turn problem per env, KL 0; "static_pool": pre-written programs drawn
without replacement, 24 envs x 8 plays, KL 0, Qwen3-8B 0.005), model, mesh and ckpt (as in
games.py, whose model, mesh, training, loss and sampling the baselines share), pool (the
static pool: a directory of *.py programs or a JSONL file of {"program": ...} rows; default
the built-in games programs), smoke (a CPU run from the tiny Hugging Face checkpoint; the
static pool's smoke writes the built-in programs to a JSONL file and draws from it).

Both: 400 iterations, no hinted plays, a new draw of programs every iteration, no designer.
Held-out evaluation is off; e.g. `--config.eval.suites=reasoning_gym --config.eval.every=50`.
"""

import json
import os

import ml_collections

from spade_jax import envs
from spade_jax.selfplay import rlve

from experiments.configs import common
from experiments.configs import games


def smoke_pool(setting: str = "games") -> str:
  """The built-in programs of ``setting`` as a static-pool JSONL file (one row each).

  Written into the cache directory (same path and content every time, so a rerun's config
  matches the saved one), atomically.
  """
  path = os.path.join(common.cache_dir(), "static_pool_smoke", f"{setting}.jsonl")
  return common.write_once(path, "".join(
      json.dumps({"id": name, "program": source}) + "\n"
      for name, source in envs.builtin_programs(setting).items()))


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, kind="rlve", model="qwen3_4b_instruct_2507", mesh="v5p-64",
                       ckpt="", pool="", smoke=False)
  common.choose("kind", a.kind, common.BASELINES)
  b = common.BASELINES[a.kind]
  c = games.get_config(f"model={a.model},mesh={a.mesh}" + (f",ckpt={a.ckpt}" if a.ckpt else ""))
  common.apply(c, common.baseline(a.kind))
  c.selfplay.num_envs, c.selfplay.plays = b["num_envs"], b["plays"]
  if b["kl"] is not None:
    c.loss.kl_coef = b["kl"]
  if a.kind == "rlve":
    c.selfplay.max_turns = 1  # one question, one answer
    c.rlve = dict(families=",".join(rlve.DEFAULT_FAMILIES), attempts=128, accuracy=0.9,
                  window=4, start_level=0)
  else:
    c.static_pool = dict(path=a.pool, key="", validate=True)
  c.eval = dict(common.EVAL)
  if a.smoke:
    common.smoke(c)
    c.selfplay.hinted_plays = 0
    if a.kind == "rlve":
      c.selfplay.max_turns = 1
    else:
      c.static_pool.path = a.pool or smoke_pool()
  return c
