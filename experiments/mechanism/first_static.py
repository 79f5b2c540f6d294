r"""The first experiment's `static` arm again, on today's learner and its own warm start.

  python -m experiments.mechanism.first_static [--seeds=0,1,2] [--iterations=30]
      [--set=loss.aggregation=seq_mean_token_mean]   # a variant, its runs named apart
  python -m experiments.mechanism.first_static --table  # its table from results/
                                                        # (also written into LEARNER.md)

The first experiment (`results/first/`) trained a 10.6M model from scratch; its `static`
arm ended below its warm start even on the levels it trained on (levels 1-2 of its ten
seen families, greedy, 16 seeds an item: warm start 0.588, `static` 0.513 ± 0.094). This
reruns that arm with the learner as it is now (the tempered policy trained, zero-advantage
rows left out, ...) and measures the same score before and after:

* the warm start is the first experiment's own (SHA-256 `FIRST_SHA256`, restored from the
  repository's history into `$SPADE_JAX_CACHE/mechanism/first/warm_start/hf`; a clone
  without that history fails with the command that fetches it);
* the arm as it ran: its ten families at levels 0-4 as the pool, 8 envs x (4 unhinted +
  4 hinted) plays an iteration, 30 iterations, lr 5e-5, everything else today's
  `experiments/configs/mechanism.py:arm=static`;
* the score: greedy plays of those families at levels 1-2, seeds 10,000-10,015, by the
  `families` suite, of the warm start and of each run's last checkpoint, with the plays'
  records kept to count repeated answers (a guess the env already turned down).

Runs live in `$SPADE_JAX_CACHE/mechanism/first/static-<seed>[-<settings>]` and resume from
their checkpoints; `results/first/static_rerun[-<settings>].json` holds the scores, the
repeat rates and each run's training series.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from absl import app
from absl import flags
import jax

from experiments.configs import common as recipes
from experiments.configs import mechanism as configs
from experiments.mechanism import common, report
from spade_jax import eval as ev, models, sampling
from spade_jax.envs.families import FAMILIES, NUM_LEVELS
from spade_jax.eval.families import repeated_answers
from spade_jax.selfplay import loop, workdir as runs

# The first experiment's seen families (its held-out one was knights_knaves).
FIRST_FAMILIES = ("arithmetic_chain", "guess_number", "ordering", "prime_factors",
                  "reach_target", "base_convert", "code_breaker", "pet_owners", "grid_path",
                  "number_sequence")
LEVELS = (1, 2)
FIRST_SHA256 = "724c654c2cbe35564029b6a763e893c9cc10d2c21f38296d9354186b7f12953d"
# Where the repository's history holds those weights (the tree before they left it).
FIRST_REV = "a0cd7810cd6805a30f701a27e5f9b8cef25e1cff^"
FIRST_DIR = "experiments/mechanism/stages/3_families/hf"
FIRST_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# The first experiment's static arm (its config.py): budget and learning rate.
ARM_ARGS = "lr=5e-5,envs=8,plays=4,hinted=4"
EVAL_SEEDS = 16
RECORD = os.path.join(common.RESULTS, "first", "static_rerun.json")


def first_dir() -> str:
  return os.path.join(common.cache_dir(), "first")


def restore(dest: str = "") -> str:
  """The first warm start's HF directory in the cache, restored from git when absent."""
  hf = dest or os.path.join(first_dir(), "warm_start", "hf")
  if (os.path.isfile(os.path.join(hf, "model.safetensors"))
      and common.weights_digest(hf) == FIRST_SHA256):
    return hf
  os.makedirs(hf, exist_ok=True)
  for name in FIRST_FILES:
    proc = subprocess.run(["git", "-C", recipes.REPO, "show", f"{FIRST_REV}:{FIRST_DIR}/{name}"],
                          capture_output=True, check=False)
    if proc.returncode:
      raise FileNotFoundError(
          f"The first warm start's {name} is not in this clone's history "
          f"({proc.stderr.decode().strip()}); fetch it with `git fetch --unshallow` (or "
          "clone without --depth) and run again.")
    tmp = os.path.join(hf, f".{name}.tmp")
    with open(tmp, "wb") as f:
      f.write(proc.stdout)
    os.replace(tmp, os.path.join(hf, name))
  got = common.weights_digest(hf)
  if got != FIRST_SHA256:
    raise ValueError(f"{hf} holds weights {got[:12]} after the restore, not the first warm "
                     f"start's {FIRST_SHA256[:12]}.")
  return hf


def pool_path() -> str:
  """The arm's pool (JSONL in the cache): the first experiment's families at every level."""
  rows = [{"id": f"{n}:{lv}", "program": FAMILIES[n].program_at(lv)}
          for n in FIRST_FAMILIES for lv in range(NUM_LEVELS)]
  return recipes.write_once(os.path.join(first_dir(), "static_pool.jsonl"),
                            "".join(json.dumps(r) + "\n" for r in rows))


def get_config(seed: int, iterations: int = 30, *, hf: str):
  """The rerun's config: today's static arm with the first experiment's budget and pool."""
  c = configs.get_config(f"arm=static,seed={seed},warm_start={hf},{ARM_ARGS},"
                         f"iterations={iterations},eval_every={iterations}")
  c.static_pool.path = pool_path()
  c.train.seq_len = 2560  # the first experiment's rows: no designer row trains here
  c.eval.at_start = False  # the warm start is measured apart (`measure`, cached)
  c.eval.overrides.families = dict(
      families=",".join(f"{n}:{LEVELS[0]}-{LEVELS[-1]}" for n in FIRST_FAMILIES),
      seeds=EVAL_SEEDS, samples=1, temperature=0.0, greedy=False,
      max_new_tokens=common.AGENT_TURN_TOKENS, max_len=3072)
  return c


def levels_score(point: dict) -> float | None:
  """Mean success over the first families at LEVELS in one evaluation point."""
  vals = [point.get(f"success/{n}/{lv}") for n in FIRST_FAMILIES for lv in LEVELS]
  if any(v is None for v in vals):
    return None
  return sum(vals) / len(vals)


def repeats(records) -> dict[str, float]:
  """Per family (and ``all``): the share of a play's answers after its first that repeat
  an answer it already gave (`eval.families.repeated_answers`)."""
  per: dict[str, list[int]] = {}
  for r in records:
    n = per.setdefault(r["family"], [0, 0])
    for i, v in enumerate(repeated_answers(r["actions"])):
      n[i] += v
  out = {f: rep / max(turns, 1) for f, (rep, turns) in sorted(per.items())}
  total = [sum(v[i] for v in per.values()) for i in (0, 1)]
  out["all"] = total[0] / max(total[1], 1)
  return out


def measure(source: str, step: int | None = None) -> dict:
  """The score's plays again, keeping their records: ``source`` is an HF directory or a
  run directory (its checkpoint ``step``, default the latest). Returns the score, success
  per item and the repeat rates."""
  if os.path.isdir(os.path.join(source, "checkpoints")):
    c, vocab, params, step = runs.load_run(source, step)
    model_cfg = c.model
  else:
    params, model_cfg, _, directory = models.load_checkpoint("hf:" + source)
    vocab = models.load_tokenizer(directory)
  rule = sampling.SamplingConfig(eos_id=vocab.eos_id, pad_id=vocab.pad_id)
  policy = sampling.Sampler(params, model_cfg, rule, jax.random.key(0), detokenize=vocab.decode)
  cfg = get_config(0, hf=source).eval.overrides.families.to_dict()
  result = ev.evaluate(policy, models.ChatTemplate(vocab, thinking=False), ["families"],
                       {"families": cfg}, progress=ev.line_progress())["families"]
  return {"source": source, "step": step, "levels_1_2": levels_score(result.scores),
          "success": {k: v for k, v in result.scores.items() if k.startswith("success/")},
          "repeats": repeats(result.records)}


def _cached(path: str, make) -> dict:
  """A measurement kept at ``path`` (greedy plays: the same every time), made once."""
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)
  out = make()
  recipes.write_once(path, json.dumps(out, indent=1))
  return out


def run(seeds, iterations: int = 30, settings=(), record: str = "") -> dict:
  """Runs (or resumes) every seed, measures the warm start and each run's end with their
  plays' records, then writes and returns the record. ``settings``: ``key=value`` config
  overrides (e.g. ``loss.aggregation=seq_mean_token_mean``) that name the runs apart."""
  hf = restore()
  slug = "-".join(re.sub(r"[^A-Za-z0-9_.=]", "", s).replace("=", "_") for s in settings)
  record = record or RECORD.replace(".json", f"-{slug}.json" if slug else ".json")
  out = {"warm_start": {"sha256": FIRST_SHA256, "rev": FIRST_REV}, "arm_args": ARM_ARGS,
         "settings": list(settings), "iterations": iterations, "eval_seeds": EVAL_SEEDS,
         "families": FIRST_FAMILIES, "levels": LEVELS,
         "first_experiment": {"start": 0.588, "end_mean": 0.513, "end_ci95": 0.094},
         "start": _cached(os.path.join(first_dir(), "start.json"), lambda: measure(hf)),
         "runs": {}}
  for seed in seeds:
    workdir = os.path.join(first_dir(), f"static-{seed}" + (f"-{slug}" if slug else ""))
    config = get_config(seed, iterations, hf=hf)
    for s in settings:
      key, value = s.split("=", 1)
      section, field = key.split(".")
      config[section][field] = type(config[section][field])(value)
    loop.train(config, workdir)
    out["runs"][str(seed)] = _cached(os.path.join(workdir, f"measure_{iterations}.json"),
                                     lambda w=workdir: measure(w, iterations))
    out["runs"][str(seed)]["train"] = report.collect(workdir, arm="static", seed=seed)["series"]
  start = out["start"]["levels_1_2"]
  ends = [r["levels_1_2"] for r in out["runs"].values()]
  for name, xs in (("end", ends), ("gain", [e - start for e in ends])):
    m, ci, n = report.mean_ci(xs)
    out[name] = {"mean": m, "ci95": ci, "n": n, "per_seed": xs}
  os.makedirs(os.path.dirname(record), exist_ok=True)
  with open(record + ".tmp", "w") as f:
    json.dump(out, f, indent=1)
  os.replace(record + ".tmp", record)
  print(f"levels {LEVELS[0]}-{LEVELS[-1]} greedy success: start {start:.3f}, after "
        f"{iterations} iterations {out['end']['mean']:.3f} ± {out['end']['ci95']:.3f} "
        f"(per seed {[round(e, 3) for e in ends]}); repeated answers: start "
        f"{out['start']['repeats']['all']:.3f}, after "
        f"{[round(r['repeats']['all'], 3) for r in out['runs'].values()]}; wrote {record}",
        flush=True)
  return out


# The families the warm start wins by naming distinct answers until one is accepted.
ENUMERATED = ("ordering", "pet_owners", "code_breaker", "number_sequence")


def table(results_dir: str = os.path.dirname(RECORD)) -> str:
  """The reruns' table (`LEARNER.md`), from every ``static_rerun*.json`` there."""
  lines = ["| runs | seeds | levels 1-2 greedy success: start -> end (per seed) | gain (95% t) "
           "| repeated answers in " + ", ".join(f"`{f}`" for f in ENUMERATED) + ": start -> end |",
           "|---|---|---|---|---|"]
  for name in sorted(os.listdir(results_dir)):
    if not (name.startswith("static_rerun") and name.endswith(".json")):
      continue
    with open(os.path.join(results_dir, name)) as f:
      d = json.load(f)
    rep = lambda m: sum(m["repeats"][f] for f in ENUMERATED) / len(ENUMERATED)
    ends = ", ".join(f"{e:.3f}" for e in d["end"]["per_seed"])
    ci = d["gain"]["ci95"]
    gain = f"{d['gain']['mean']:+.3f}" + (f" ± {ci:.3f}" if ci == ci else "")
    runs = "today's `static`" + (" with " + ", ".join(f"`{s}`" for s in d["settings"])
                                 if d["settings"] else "")
    lines.append(f"| {runs} | {d['end']['n']} | {d['start']['levels_1_2']:.3f} -> "
                 f"{d['end']['mean']:.3f} ({ends}) | {gain} | {rep(d['start']):.2f} -> "
                 + ", ".join(f"{rep(r):.2f}" for r in d["runs"].values()) + " |")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _TABLE.value:
    run([int(s) for s in _SEEDS.value], _ITERATIONS.value, _SET.value)
  text = table()
  print(text)
  if report.fill(common.LEARNER, "first_static", text + "\n"):
    print(f"filled {common.LEARNER}", flush=True)


if __name__ == "__main__":
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds to run.")
  _ITERATIONS = flags.DEFINE_integer("iterations", 30, "Iterations a run.")
  _SET = flags.DEFINE_multi_string("set", [], "A config override SECTION.FIELD=VALUE that "
                                   "names the runs apart, e.g. loss.aggregation=seq_mean_"
                                   "token_mean.")
  _TABLE = flags.DEFINE_bool("table", False, "Only print the table from the results files.")
  app.run(main)
