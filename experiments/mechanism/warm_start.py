r"""The warm start: a short SFT of SmolLM2-135M-Instruct, through the library's trainer.

  python -m experiments.mechanism.warm_start            # build (or resume) in the cache
  python -m experiments.mechanism.warm_start --base  # SmolLM2 as shipped, measured
                                                      # (1 seed, 1 play, 2 designs)

The run is `experiments/configs/mechanism.py:arm=warm_start`: `build_run`, `Trainer` with
`train.objective="sft"`, the library's `Checkpointer` (every `checkpoint_every` steps) and
`MetricsWriter`. Its rows are built once into `$SPADE_JAX_CACHE/mechanism/sft_rows/`
(named by a digest of what they are made from):

* designer rows: the run's designer prompt (its renderer, corpus and 2,048-token budget,
  half of them with a memory exemplar), answered by a seen family's program (the config's
  `programs`: by default the short library program) at knob
  values drawn from the levels `designer_levels` (`data.designer_examples`);
* agent rows: seen families played in the sandbox by a scripted player that follows the
  episode's `solution()`, writes the family's worked step before `\boxed{...}` and slips
  now and then (`data.agent_examples`; a slip is context, not trained, unless
  `train_slips`); some plays see the program's own hint.

Only the generated side of a row is trained. A killed build resumes at its last
checkpoint with the same batches; a build directory holding another config is refused.
The finished build exports `hf/` and writes `warm_start.json` (also into `results/`): the
weights' SHA-256 and the measured starting levels (the `families` suite on the seen
families at the designers' level and on the held-out family, sampled and greedy; the
designer's valid rate on fresh prompts).
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import os
import shutil
import tempfile
import time

from absl import app
from absl import flags
from etils import epath
import jax
import numpy as np

from experiments.configs import mechanism as configs
from experiments.mechanism import common, data
from spade_jax import designer as dz
from spade_jax import envs, eval as ev, models, sandbox
from spade_jax.checkpoint import Checkpointer
from spade_jax.envs.families import FAMILIES
from spade_jax.metrics import MetricsWriter
from spade_jax.sampling import Sampler
from spade_jax.selfplay import build as builder, loop


# The config keys that decide the warm start's weights (of `sft`, `made_of` it).
IDENTITY = ("seed", "iterations", "tokenizer", "model", "train", "loss", "optimizer", "sft")
MEASURE = ("agent_eval", "designer_eval")  # sft keys of how the finished build is measured


def made_of(sft: dict) -> dict:
  """The `sft` keys that decide the rows and weights: all but `MEASURE`'s."""
  return {k: v for k, v in sft.items() if not k.startswith(MEASURE)}


def _log(msg: str) -> None:
  print(f"[warm_start {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def split(config):
  """(the library's run config, the SFT data section) of a warm-start config."""
  run_cfg = copy.deepcopy(config)
  sft = run_cfg.sft.to_dict()
  del run_cfg.sft
  return run_cfg, sft


def rows(run, sft: dict, seed: int) -> list[data.Example]:
  """The SFT rows: read from the cache, or built once (sandbox plays) and written there."""
  c = run.config
  key = json.dumps({"sft": made_of(sft), "seed": seed, "tokenizer": os.path.abspath(c.tokenizer),
                    "families": {n: FAMILIES[n].program_at(2) for n in common.seen()},
                    "designer_budget": sft["designer_prompt_tokens"]}, sort_keys=True)
  path = os.path.join(common.cache_dir(), "sft_rows",
                      hashlib.sha256(key.encode()).hexdigest()[:16] + ".jsonl")
  if os.path.isfile(path):
    return data.load(path)
  chat = models.ChatTemplate(run.vocab, thinking=False)
  _log(f"building {sft['designer_rows']} designer and {sft['agent_rows']} agent rows")
  corpus = data.corpus(os.path.join(common.cache_dir(), "corpus"), seed)
  out = data.designer_examples(chat, corpus, sft["designer_rows"], seed,
                               families=common.seen(),
                               budget=sft["designer_prompt_tokens"],
                               programs=sft["programs"], levels=sft["designer_levels"])
  with sandbox.EnvPool(c.sandbox) as pool:
    out += data.agent_examples(pool, chat, sft["agent_rows"], seed, families=common.seen(),
                               levels=sft["agent_levels"], p=sft["slip"],
                               p_hinted=sft["slip_hinted"], hinted_frac=sft["hinted_frac"],
                               max_turns=common.MAX_TURNS, worked=True,
                               train_slips=sft["train_slips"])
  data.save(out, path)
  return out


def levels(params, run, sft: dict, *, seeds: int, designs: int, samples: int = 0,
           greedy: bool = True) -> dict:
  """The starting levels of ``params``: the agent by the `families` suite (the seen
  families at the designers' level, the held-out family at `HELD_OUT_LEVELS`; sampled
  success, pass@k and greedy; ``samples``: plays per seed, default the config's) and the designer's
  valid rate on ``designs`` fresh prompts."""
  c = run.config
  chat = models.ChatTemplate(run.vocab, thinking=False)
  fam = dict(c.eval.overrides["families"], seeds=seeds, families=sft["agent_eval_items"],
             greedy=greedy)
  if samples:
    fam["samples"] = samples
  t0 = time.time()
  with sandbox.EnvPool(c.sandbox) as pool:
    policy = Sampler(params, c.model, c.sampling, jax.random.key(0), mesh=run.mesh,
                     rules=run.rules)
    scores = ev.evaluate(policy, chat, ["families"], {"families": fam},
                         pool=pool)["families"].scores
    out = {"agent": _agent_summary(scores), "agent_scores": scores,
           "designer": designer_valid_rate(params, run, chat, pool, designs) if designs
           else None}
  out["seconds"] = round(time.time() - t0, 1)
  return out


def _agent_summary(scores: dict) -> dict:
  """Mean over the seen families at the designers' level of each rate, and the held-out
  family's."""
  out = {}
  for rate in ("success", "pass@k", "greedy"):
    seen = [v for k, v in scores.items() if k.startswith(f"{rate}/")
            and k.split("/")[1] != common.HELD_OUT]
    if seen:
      out[f"seen_medium/{rate}"] = sum(seen) / len(seen)
    if f"held_out/{rate}" in scores:
      out[f"held_out/{rate}"] = scores[f"held_out/{rate}"]
  return out


def designer_valid_rate(params, run, chat, pool, designs: int) -> dict:
  """Valid rate, rejection reasons and written families of ``designs`` designer samples
  (the run's prompt renderer, corpus, budget and designer sampling; no memory)."""
  c = run.config
  skills = common.skills()
  count = lambda t: len(chat.prompt(None, t))
  corpus = data.corpus(os.path.join(common.cache_dir(), "corpus"), seed=1234)
  prompts = [chat.prompt(None, dz.designer_prompt(
      common.SETTING, skills[i % len(skills)], corpus.next(),
      budget=c.selfplay.designer_prompt_tokens, count=count)) for i in range(designs)]
  sampler = Sampler(params, c.model, c.designer_sampling, jax.random.key(1), mesh=run.mesh,
                    rules=run.rules)
  gen = sampler(prompts, c.selfplay.designer_new_tokens)
  verdicts = envs.validate_many([chat.vocab.decode(t) for t in gen.tokens], pool,
                                c.validation)
  fams = collections.Counter(common.family_of(v.source)[0] or "other"
                             for v in verdicts if v.valid)
  return {"designs": designs, "valid_rate": sum(v.valid for v in verdicts) / designs,
          "rejected": dict(collections.Counter(v.reason for v in verdicts if not v.valid)),
          "families": dict(fams)}


def export(params, run, out: str) -> str:
  """Writes ``params`` as an HF checkpoint with the run's tokenizer in ``out/hf``,
  atomically (a sibling temporary directory renamed into place)."""
  hf = os.path.join(out, "hf")
  tmp = tempfile.mkdtemp(prefix=".hf.", dir=out)
  models.save_hf(tmp, jax.device_get(params), run.config.model)
  tok = run.config.tokenizer
  models.copy_tokenizer_files(tok if os.path.isdir(tok) else os.path.dirname(tok), tmp)
  if os.path.isdir(hf):
    shutil.rmtree(hf)
  os.rename(tmp, hf)
  return hf


def build(arg: str = "", out: str = "", smoke: bool = False, seeds: int = 0,
          designs: int = -1, results: str | None = None, measure: bool = True) -> dict:
  """Builds (or resumes, or only reads back) the warm start; returns its record.

  Args:
    arg: further `mechanism.py` arguments (e.g. "steps=400").
    out: the build directory (default the cache's).
    smoke: the tiny random model's two-step build.
    seeds, designs: the starting-level measurement's size (default the config's).
    results: where `warm_start.json` is copied (default `results/`, none for smoke).
    measure: measure the starting levels (False: the record's "levels" is None).
  """
  arg = ",".join(a for a in ("arm=warm_start", arg, "smoke" if smoke else "") if a)
  config = configs.get_config(arg)
  out = os.path.abspath(out or common.warm_start_dir(smoke))
  record_path = os.path.join(out, "warm_start.json")
  os.makedirs(out, exist_ok=True)
  # What makes the weights (not the arms' sections): a directory of another one is refused.
  identity = {k: config[k].to_dict() if hasattr(config[k], "to_dict") else config[k]
              for k in IDENTITY}
  identity["sft"] = made_of(identity["sft"])
  loop.check_config(identity, epath.Path(out))
  if os.path.isfile(record_path):
    with open(record_path) as f:
      record = json.load(f)
    if record["steps"] == config.iterations:
      return record
  run_cfg, sft = split(config)
  run = builder.build_run(run_cfg)
  _log(builder.summary(run))
  train_rows = rows(run, sft, config.seed)
  c = run.config
  ckpt = Checkpointer(out, keep=c.keep_checkpoints)
  trainer = run.trainer
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          trainer.abstract_state(), trainer.state_shardings)
  restored = ckpt.restore(abstract, {"rows": np.zeros((), np.int64)})
  if restored is not None:
    state, _, host = restored
    start = int(host["next_step"])
    if start > c.iterations:
      raise ValueError(f"{out} already trained {start} steps, more than the {c.iterations} "
                       "asked for; ask for at least as many, or build in another --out.")
    _log(f"resumed at step {start} of {c.iterations}")
  else:
    state, start = run.initial_state(), 0
  writer = MetricsWriter(out, tensorboard=False, resume_step=start)
  batches = data.pack(train_rows, c.train.batch_size, c.train.seq_len, config.seed)
  for _ in range(start):  # the batches already trained on, skipped as packed
    next(batches)
  every = max(1, c.checkpoint_every)
  for step in range(start, c.iterations):
    t0 = time.perf_counter()
    state, metrics = trainer.step(state, next(batches))
    metrics = jax.device_get(metrics)  # the step has run: its time is the step's
    metrics = writer.write(step + 1, {**metrics, "time/step": time.perf_counter() - t0})
    _log(f"step {step + 1}/{c.iterations} loss {metrics['loss']:.4f}")
    if (step + 1) % every == 0 or step + 1 == c.iterations:
      ckpt.save(step + 1, state, {"rows": np.asarray(len(train_rows), np.int64)},
                {"next_step": step + 1})
  writer.close()
  ckpt.close()
  hf = export(state.params, run, out)
  if results is None and not smoke:
    results = common.RESULTS
  measured = None
  if measure:
    default = not seeds and designs < 0  # measured as the config says
    measured = measured_before(os.path.join(results, "warm_start.json"), hf, config) \
        if results and default else None
    if measured is None:
      measured = levels(state.params, run, sft, seeds=seeds or sft["agent_eval_seeds"],
                        designs=sft["designer_eval"] if designs < 0 else designs)
  losses = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  record = {"sha256": common.weights_digest(hf),
            "fingerprint": common.weights_fingerprint(hf), "hf": hf, "base": c.init_from,
            "steps": c.iterations, "rows": {"total": len(train_rows), **dict(
                collections.Counter("designer" if r.role == data.DESIGNER else "agent"
                                    for r in train_rows))},
            "loss_first": losses[0]["loss"], "loss_last": losses[-1]["loss"],
            "levels": measured, "config": json.loads(config.to_json())}
  _write(record_path, record)
  if results:
    _write(os.path.join(results, "warm_start.json"), record)
  _log(f"warm start {record['sha256'][:12]} in {hf}: "
       f"{measured['agent'] if measured else 'not measured'}")
  return record


def measured_by(config: dict) -> dict:
  """The parts of a warm start's config (as JSON) that its starting levels depend on,
  beside its weights: `levels`' suite, sampling, designer prompt and validation."""
  sp = config.get("selfplay", {})
  return {"sft": {k: v for k, v in config.get("sft", {}).items() if k.startswith(MEASURE)},
          **{k: config.get(k) for k in ("eval", "sampling", "designer_sampling",
                                        "validation")},
          **{k: sp.get(k) for k in ("designer_prompt_tokens", "designer_new_tokens")}}


def same_build(record: dict, hf: str, digest: str = "") -> bool:
  """Whether a record (warm start, run marker, start evaluation) names the weights in
  ``hf`` (whose SHA-256 is ``digest`` when the caller has it): the same SHA-256, or the same
  model by `common.same_weights` (a rebuild on another CPU rounds differently)."""
  if record.get("sha256") == (digest or common.weights_digest(hf)):
    return True
  return bool(record.get("fingerprint")) and common.same_weights(
      record["fingerprint"], common.weights_fingerprint(hf))


def measured_before(path: str, hf: str, config) -> dict | None:
  """The starting levels a results record at ``path`` holds for the weights in ``hf``
  (`same_build`), measured as ``config`` measures (`measured_by`), else None: a rebuild on
  another machine reads them back instead of measuring again (~13 min here)."""
  if not path or not os.path.isfile(path):
    return None
  with open(path) as f:
    record = json.load(f)
  if (record.get("levels") is None or not same_build(record, hf) or
      measured_by(record.get("config", {})) != measured_by(json.loads(config.to_json()))):
    return None
  _log(f"starting levels of {hf} read back from {path}")
  return record["levels"]


def base_levels(arg: str = "", seeds: int = 1, designs: int = 2, samples: int = 1,
                greedy: bool = False, smoke: bool = False, path: str = "") -> dict:
  """The starting levels of the model as shipped (no SFT), written to ``path`` (default
  `results/base_levels.json`)."""
  config = configs.get_config(",".join(a for a in ("arm=warm_start", arg,
                                                   "smoke" if smoke else "") if a))
  run_cfg, sft = split(config)
  run = builder.build_run(run_cfg)
  params = run.initial_state().params
  record = {"base": run.config.init_from, "seeds": seeds, "samples": samples,
            "greedy": greedy, "designs": designs,
            "levels": levels(params, run, sft, seeds=seeds, designs=designs, samples=samples,
                             greedy=greedy)}
  _write(path or os.path.join(common.RESULTS, "base_levels.json"), record)
  return record


def _write(path: str, record: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1)
  os.replace(path + ".tmp", path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _BASE.value:
    rec = base_levels(_ARGS.value, seeds=_ITEMS.value or 1,
                      designs=2 if _DESIGNS.value < 0 else _DESIGNS.value,
                      samples=_SAMPLES.value or 1, greedy=_GREEDY.value, smoke=_SMOKE.value)
  else:
    rec = build(_ARGS.value, _OUT.value, smoke=_SMOKE.value, seeds=_ITEMS.value,
                designs=_DESIGNS.value)
  print(json.dumps(rec["levels"]["agent"], indent=1))
  print(json.dumps(rec["levels"]["designer"], indent=1))


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _SMOKE, _ARGS, _OUT, _BASE, _ITEMS, _DESIGNS, _SAMPLES, _GREEDY
  _SMOKE = flags.DEFINE_bool("smoke", False, "A two-step build of a tiny random model.")
  _ARGS = flags.DEFINE_string("args", "", "Further config arguments, e.g. 'steps=400'.")
  _OUT = flags.DEFINE_string("out", "", "Build directory (default: the cache's).")
  _BASE = flags.DEFINE_bool("base", False, "Measure the model as shipped (no SFT) and write "
                            "results/base_levels.json.")
  _ITEMS = flags.DEFINE_integer("items", 0, "Seeds per family and level (default: the "
                                "config's).")
  _DESIGNS = flags.DEFINE_integer("designs", -1, "Designer samples (default: the config's; "
                                  "2 with --base).")
  _SAMPLES = flags.DEFINE_integer("samples", 0, "Sampled plays per seed (default: the "
                                  "config's; 1 with --base).")
  _GREEDY = flags.DEFINE_bool("greedy", False, "With --base: also one greedy play a seed.")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
