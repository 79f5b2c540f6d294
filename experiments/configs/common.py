"""Pieces the recipe configs share: argument parsing, mesh presets, the paper's numbers, the
ablations, and the tiny Hugging Face checkpoint that `smoke` variants start from.

A recipe's argument is big_vision style, comma-separated `key=value` pairs and bare flags:
`games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64,ablation=no_corpus` or `games.py:smoke`.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import ml_collections

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_TOKENIZER = os.path.join(REPO, "experiments", "tokenizers", "tiny_bpe_4k")

# Hugging Face names of the presets the recipes start from.
HF_NAMES = {
    "qwen3_4b_instruct_2507": "Qwen3-4B-Instruct-2507",
    "qwen3_30b_a3b_instruct_2507": "Qwen3-30B-A3B-Instruct-2507",
    "qwen3_4b": "Qwen3-4B", "qwen3_8b": "Qwen3-8B", "qwen3_30b_a3b": "Qwen3-30B-A3B",
}

# Chips (JAX devices) per slice; a preset's mesh uses them all, with explicit axis sizes so
# a dry run knows how many devices to plan for.
SLICES = {"v5p-64": 32, "v5p-128": 64, "v5p-256": 128, "v6e-64": 64, "v4-64": 32,
          "v4-128": 64}
# Experts per expert-parallel group for MoE models (the reference runs 30B-A3B with EP 8).
EXPERT_PARALLEL = 8

# The reference's sampling, optimiser and loss (docs/METHOD.md §1, §6).
SAMPLING = dict(temperature=0.6, top_p=0.95, top_k=20)
HINT_SAMPLING = dict(temperature=0.3, top_p=0.95, top_k=20)
OPTIMIZER = dict(name="adamw", learning_rate=1e-6, schedule="constant", weight_decay=0.1,
                 b1=0.9, b2=0.98)
LOSS = dict(eps_low=0.2, eps_high=0.28, kl_estimator="k3", entropy_coef=0.0, tis_cap=2.0,
            aggregation="token_mean")

# docs/METHOD.md §6-§7: the baselines train the agent only, with no hinted plays, a new draw
# of programs every iteration and no designer credit (so a one-iteration window).
BASELINES = {
    "rlve": dict(num_envs=16, plays=16, kl=0.0),
    # KL None: the model's own (games.MODELS: 0, Qwen3-8B 0.005).
    "static_pool": dict(num_envs=24, plays=8, kl=None),
}


def baseline(kind: str) -> dict:
  """The config changes that turn a games recipe into baseline `kind`'s data path."""
  return {"selfplay.env_source": kind, "selfplay.hinted_plays": 0,
          "selfplay.regen_every": 1, "rewards.credit_window": 1}


# The `eval` section with every knob present, so `--config.eval.suites=a,b` works under
# lock_config; no suites: held-out evaluation is off.
EVAL = dict(suites="", every=0, at_start=False, limit=0, samples=0, max_new_tokens=0, batch_size=0,
            data_dir="", seed=0)
# The contamination audit (`spade_jax.selfplay.audit`) with every knob present: flags what
# holds a held-out item; --config.audit.mode=drop leaves it out, =off checks nothing.
AUDIT = dict(mode="flag", suites="", min_matches=1, hint_min_share=0.6, hint_min_actions=3)

# docs/METHOD.md §9: each ablation as the config change that makes it.
ABLATIONS = {
    "": {},
    "no_corpus": {"selfplay.no_corpus": True},
    "no_memory": {"memory.no_memory": True},
    "no_designer_training": {"selfplay.train_designer": False},
    "static_pool": baseline("static_pool"),
    "two_skills": {"selfplay.skills": ("mathematical reasoning", "pattern recognition"),
                   "selfplay.skills_per_regen": 2},
    "learning_potential": {"rewards.variant": "learning_potential"},
    "solve_rate": {"rewards.variant": "solve_rate"},
}


def parse_arg(arg: str, **defaults):
  """Parses `a=1,b,c=x` against `defaults` (their types convert the values).

  Returns:
    An `ml_collections.ConfigDict` with every default, overridden by the argument. A bare
    key sets a boolean default to True. Unknown keys raise, listing the valid ones.
  """
  out = dict(defaults)
  for part in filter(None, (p.strip() for p in arg.split(","))):
    key, eq, value = part.partition("=")
    if key not in defaults:
      raise ValueError(f"Unknown config argument {key!r} in {arg!r}; valid: "
                       f"{sorted(defaults)}.")
    default = defaults[key]
    if not eq:
      if not isinstance(default, bool):
        raise ValueError(f"Config argument {key!r} needs a value ({key}=...).")
      out[key] = True
    elif isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = type(default)(value)
  return ml_collections.ConfigDict(out)


def choose(name: str, value: str, table) -> None:
  """Raises when `value` is not a key of `table`, listing the valid ones."""
  if value not in table:
    raise ValueError(f"Unknown {name} {value!r}; expected one of {sorted(table)}.")


def mesh_preset(mesh: str, moe: bool) -> dict:
  """Mesh axes and rule set for a slice: FSDP for dense models, FSDP x expert for MoE."""
  if mesh == "cpu":
    return dict(data=-1, fsdp=1, tensor=1, expert=1, rules="fsdp")
  choose("mesh", mesh, {**SLICES, "cpu": 0})
  n = SLICES[mesh]
  if moe:
    return dict(data=1, fsdp=n // EXPERT_PARALLEL, tensor=1, expert=EXPERT_PARALLEL,
                rules="fsdp_tensor_expert")
  return dict(data=1, fsdp=n, tensor=1, expert=1, rules="fsdp")


def recipe(a, *, setting: str, iterations: int, envs: int, plays: int, hinted: int,
           regen: int, kl: float, designer_tokens: int, doc_words: int,
           llm_validator: bool = False) -> ml_collections.ConfigDict:
  """A SPADE recipe (docs/METHOD.md §6) from its numbers and the parsed argument `a` (model,
  mesh, ckpt, ablation, smoke); everything else is the paper's shared setting."""
  choose("ablation", a.ablation, ABLATIONS)
  import dataclasses  # pylint: disable=g-import-not-at-top
  from spade_jax.models import get_preset  # pylint: disable=g-import-not-at-top
  moe = "a3b" in a.model
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.iterations = iterations
  c.checkpoint_every = 4
  c.keep_checkpoints = 3
  c.tokenizer = ""
  # The preset's architecture (checked against the checkpoint's config.json), fp32 master
  # weights, bf16 compute, full rematerialisation.
  c.model = dict(dataclasses.asdict(get_preset(a.model)),
                 init_from="hf:" + (a.ckpt or default_checkpoint(a.model)),
                 param_dtype="float32", compute_dtype="bfloat16", remat="full")
  c.mesh = mesh_preset(a.mesh, moe)
  # One 32,768-token row per device per micro-batch; overflow rows open further batches
  # that accumulate into the same update.
  devices = SLICES.get(a.mesh, 8)
  c.train = dict(batch_size=4 * devices, seq_len=32_768, num_microbatches=4,
                 logprob_chunk=1024, old_logps="recompute", share_prefix=16)
  c.loss = dict(LOSS, kl_coef=kl)
  c.optimizer = dict(OPTIMIZER)
  c.sampling = dict(SAMPLING)
  c.designer_sampling = dict(SAMPLING)
  c.hint_sampling = dict(HINT_SAMPLING)
  # Every role uses the model's own chat format: the Instruct-2507 models never think,
  # Qwen3-8B thinks in both roles (`*_thinking=False` would add Qwen3's empty think block).
  c.selfplay = dict(
      setting=setting, skills=(), num_envs=envs, plays=plays, hinted_plays=hinted,
      max_turns=25, agent_turn_tokens=8192, designer_new_tokens=designer_tokens,
      designer_prompt_tokens=12_288, skills_per_regen=3, designer_resamples=5,
      regen_every=regen, hint_source="policy", hint_tokens=1024,
      llm_validator=llm_validator, judge_tokens=2048, designer_thinking=True,
      agent_thinking=True,
      # Schedule options, off as the reference runs: --config.selfplay.overlap_play=True
      # steps envs while other rows decode (play_cohorts=k: in k out-of-phase cohorts of
      # rows); design_ahead=True decodes the next regeneration's designs beside the plays
      # before it; dynamic_sampling=True (DAPO).
      overlap_play=False, play_cohorts=0, design_ahead=False, dynamic_sampling=False)
  c.rewards = dict(variant="blend", credit_window=regen)
  c.corpus = dict(source="embedded", max_words=doc_words, decontaminate=False)
  c.memory = dict(capacity=200)
  c.sandbox = dict(num_workers=16)
  c.validation = dict()
  # Held-out evaluation, off by default: e.g. --config.eval.suites=reasoning_gym,bfcl
  # --config.eval.every=50 logs eval/<suite>/<metric> during training.
  c.eval = dict(EVAL)
  c.audit = dict(AUDIT)
  apply(c, ABLATIONS[a.ablation])
  if a.smoke:
    smoke(c, moe)
  return c


def apply(c: ml_collections.ConfigDict, changes: dict) -> None:
  """Applies dotted-key changes (`{"selfplay.no_corpus": True}`) to a config."""
  for dotted, value in changes.items():
    section, key = dotted.split(".")
    c[section][key] = value


def default_checkpoint(model: str) -> str:
  """Where a recipe looks for its starting checkpoint: $SPADE_JAX_CHECKPOINTS/<HF name>."""
  root = os.environ.get("SPADE_JAX_CHECKPOINTS", "~/checkpoints")
  return os.path.join(os.path.expanduser(root), HF_NAMES.get(model, model))


def cache_dir() -> str:
  return os.path.expanduser(os.environ.get("SPADE_JAX_CACHE", "~/.cache/spade_jax"))


def tiny_hf_checkpoint(moe: bool = False) -> str:
  """A tiny random Qwen3 (or Qwen3-MoE) in Hugging Face format with the tiny BPE tokenizer.

  Written once into the cache directory ($SPADE_JAX_CACHE, default ~/.cache/spade_jax) by our
  own exporter (same seed, same files every time), so `smoke` variants start through the
  same `model.init_from=hf:DIR` path as the paper's recipes.

  Returns:
    The checkpoint directory.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  name = "tiny_qwen3_moe_hf" if moe else "tiny_qwen3_hf"
  out = os.path.join(cache_dir(), name)
  if os.path.isfile(os.path.join(out, "config.json")):
    return out
  cfg = models.get_preset("tiny_moe" if moe else "tiny", vocab_size=4096)
  params = models.init_params(jax.random.key(0), cfg)
  os.makedirs(cache_dir(), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir())
  models.save_hf(tmp, params, cfg)
  models.copy_tokenizer_files(TINY_TOKENIZER, tmp)
  try:
    os.rename(tmp, out)  # atomic: concurrent builders keep the first
  except OSError:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def write_once(path: str, text: str) -> str:
  """Writes `text` to `path` unless it already holds exactly that (atomically: a temporary
  file renamed into place), so a rerun's config names the same file with the same
  content. Returns `path`."""
  if not os.path.isfile(path) or open(path, encoding="utf-8").read() != text:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  return path


def smoke(c: ml_collections.ConfigDict, moe: bool = False) -> None:
  """Shrinks a recipe to a CPU run through the same code path (a tiny HF checkpoint)."""
  c.iterations = 2
  c.model = dict(init_from="hf:" + tiny_hf_checkpoint(moe))
  c.tokenizer = ""
  c.mesh = mesh_preset("cpu", moe)
  c.train = dict(batch_size=8, seq_len=1536, num_microbatches=1, share_prefix=16)
  c.optimizer.learning_rate = 1e-4
  s = c.selfplay
  s.num_envs, s.plays, s.hinted_plays, s.max_turns = 2, 2, 2, 2
  s.agent_turn_tokens, s.designer_new_tokens, s.designer_prompt_tokens = 24, 64, 1280
  s.designer_resamples, s.regen_every, s.hint_tokens = 1, 1, 32
  if "llm_validator" in s:
    s.judge_tokens = 32
  c.rewards.credit_window = 1
  c.corpus = dict(source="embedded", max_words=200, decontaminate=False)
  c.sandbox = dict(num_workers=2)
  c.validation = dict(random_episodes=2, random_steps=3)


__all__ = ["ABLATIONS", "AUDIT", "BASELINES", "EVAL", "apply", "baseline", "choose", "mesh_preset",
           "parse_arg", "smoke", "tiny_hf_checkpoint", "write_once"]
