r"""The learning recipe side by side with TRL's GRPOTrainer: reward curves, held-out gain,
seconds per GRPO step.

  python -m experiments.benchmarks.learn_vs_trl --seed=0
  python -m experiments.benchmarks.learn_vs_trl --seed=1 --steps=60 \
      --ours_workdir=/tmp/learn/chain_sum-1     # reuse a finished run of the same config

Both sides start from the same weights (SmolLM2-135M-Instruct as our HF export, converted
from the packaged GGUF file), see the same problems in the same order (our RLVE source's
draws for the seed, rendered with our chat template; the TRL side checks its tokenizer
gives the same prompt ids), and share group size, learning rate and schedule (constant),
AdamW (0.9, 0.98, wd 0.1), gradient clip 1, temperature (no top-k / top-p), max new
tokens, token-level loss aggregation (TRL "dapo" = our "token_mean"), group z-scored
advantages, beta 0, one update per generation and the number of steps. The reward is the
same lenient answer check (`spade_jax/sandbox/worker/actions.py`, the library's answer
parser, loaded from its file by the TRL side). Held-out accuracy of both trained models is measured by the same suite
(`eval.procedural`, the recipe's settings) with the same sampling seeds.

Prints both reward curves, held-out lenient / strict accuracy before and after, the
paired 95% interval of (ours after - TRL after) over the held-out items, and seconds per
step split into generation and update (means over steps 2..N, so the first step's
compilation and warm-up are left out and reported apart; later steps of ours that compile
a new program, a wider batch or a narrower decode, are counted, and the ratio is printed
again without the seconds JAX's compile events measured in them). Writes the record to
experiments/learn/results/learn_vs_trl-<seed>-<time>.json. TRL runs in .venv-peers
(experiments/benchmarks/peers_venv.sh creates it).
"""

import dataclasses
import json
import math
import os
import subprocess
import time

from absl import app
from absl import flags
import numpy as np

from experiments.configs import common
from experiments.configs import learn

_SEED = flags.DEFINE_integer("seed", 0, "Seed of both runs (problem stream, sampling).")
_STEPS = flags.DEFINE_integer("steps", 60, "GRPO steps on each side.")
_OURS = flags.DEFINE_string("ours_workdir", "", "A finished run of the same config to "
                            "read instead of training ours again (default: train it).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where runs go (default: the cache).")
_EVAL_ITEMS = flags.DEFINE_integer("eval_items", 96, "Held-out problems.")
_OUT = flags.DEFINE_string("out", os.path.join(common.REPO, "experiments", "learn",
                                               "results"), "Where the record goes.")

ROOT = common.REPO


def _config(seed: int, steps: int, items: int):
  return learn.get_config(f"seed={seed},iterations={steps},eval_every=0,eval_items={items}")


def problem_stream(config) -> list[dict]:
  """The problems our run plays, in order, with the prompt text and ids its agent sees."""
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.eval import procedural  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import baselines, rlve  # pylint: disable=g-import-not-at-top
  _, directory = models.resolve_checkpoint(config.model.init_from)
  vocab = models.HFTokenizer(directory)
  chat = models.ChatTemplate(vocab, thinking=config.selfplay.agent_thinking)
  source = baselines.RLVESource(rlve.RLVEConfig(**config.rlve), setting="games",
                                seed=config.seed)
  out = []
  for it in range(config.iterations):
    for drawn in source.draw(it, config.selfplay.num_envs, None):
      family, level, seed = drawn.doc_id.split("/")
      task = procedural.generate(family, int(level), int(seed))
      user = procedural.PROMPT.format(question=task["question"])
      ids = chat.prompt(None, user)
      text = models.render_chat([{"role": "user", "content": user}]) + \
          "<|im_start|>assistant\n"
      out.append({"prompt": text, "prompt_ids": ids, "answer": task["answer"],
                  "question": task["question"]})
  return out


def evaluate_hf(directory: str, config) -> dict:
  """The recipe's held-out suite on an HF checkpoint (e.g. TRL's trained model)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import eval as eval_lib  # pylint: disable=g-import-not-at-top
  from spade_jax import models, sampling  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build  # pylint: disable=g-import-not-at-top
  params, cfg, _, _ = models.load_checkpoint("hf:" + directory)
  cfg = dataclasses.replace(cfg, param_dtype="float32", compute_dtype="float32")
  vocab = models.HFTokenizer(directory)
  chat = models.ChatTemplate(vocab, thinking=config.selfplay.agent_thinking)
  ev = build.resolve(config).eval
  rule = sampling.SamplingConfig(temperature=config.sampling.temperature,
                                 eos_id=vocab.eos_id, pad_id=vocab.pad_id)
  policy = sampling.Sampler(params, cfg, rule, jax.random.key(ev.seed))
  return eval_lib.run_suites(policy, chat, ev.suites, ev.suite_configs())


def _series(path: str, key: str) -> dict[int, float]:
  out = {}
  for line in open(path):
    row = json.loads(line)
    if key in row:
      out[int(row["step"])] = float(row[key])
  return out


def _ours(config, workdir: str) -> dict:
  from spade_jax.selfplay import loop  # pylint: disable=g-import-not-at-top
  m = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(m) or max(_series(m, "time/train"), default=0) < config.iterations:
    loop.train(config, workdir)  # trains, or resumes a run that stopped early
  reward = _series(m, "agent/reward_nohint")
  play, train = _series(m, "time/play"), _series(m, "time/train")
  play_c, train_c = _series(m, "time/play_compile"), _series(m, "time/train_compile")
  skipped, packed = _series(m, "batch/skipped_rows"), _series(m, "batch/batches")
  evals = {}
  for key in ("lenient", "strict", "lenient@k", "greedy/lenient", "greedy/strict",
              "format"):
    s = _series(m, f"eval/procedural/{key}")
    evals[key] = {"before": s.get(0), "after": s.get(config.iterations)}
  steps = sorted(reward)
  return {"workdir": workdir, "reward": [reward[s] for s in steps],
          "seconds_generate": [play[s] for s in steps],
          "seconds_update": [train[s] for s in steps],
          "seconds_generate_compile": [play_c.get(s, 0.0) for s in steps],
          "seconds_update_compile": [train_c.get(s, 0.0) for s in steps],
          # Rows left out of each update for a zero advantage (train.skip_zero_advantage),
          # and whether any row was left to differentiate.
          "skipped_rows": [skipped.get(s, 0.0) for s in steps],
          "differentiated": [packed.get(s, 1.0) > 0 for s in steps], "eval": evals}


def main(argv):
  del argv
  seed, steps = _SEED.value, _STEPS.value
  config = _config(seed, steps, _EVAL_ITEMS.value)
  base = _WORKDIR.value or os.path.join(common.cache_dir(), "learn_vs_trl", f"seed{seed}")
  os.makedirs(base, exist_ok=True)
  # Ours.
  t0 = time.perf_counter()
  ours = _ours(config, _OURS.value or os.path.join(base, "ours"))
  print(f"ours: {steps} steps in {time.perf_counter() - t0:.0f}s", flush=True)
  # TRL, on our HF export of the same weights and our problem stream.
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  _, model_dir = models.resolve_checkpoint(config.model.init_from)
  problems = problem_stream(config)
  spec = {"model": model_dir, "problems": problems, "steps": steps,
          "prompts_per_step": config.selfplay.num_envs, "group": config.selfplay.plays,
          "lr": config.optimizer.learning_rate, "temperature": config.sampling.temperature,
          "max_new_tokens": config.selfplay.agent_turn_tokens, "seed": seed,
          "lenient": os.path.join(ROOT, "spade_jax", "sandbox", "worker", "actions.py")}
  trl_dir = os.path.join(base, "trl")
  os.makedirs(trl_dir, exist_ok=True)
  spec_path = os.path.join(trl_dir, "spec.json")
  json.dump(spec, open(spec_path, "w"))
  peers = subprocess.run(["bash", os.path.join(ROOT, "experiments", "benchmarks",
                                                "peers_venv.sh")],
                         check=True, capture_output=True, text=True).stdout.strip()
  t0 = time.perf_counter()
  proc = subprocess.run([peers, os.path.join(ROOT, "experiments", "benchmarks",
                                             "_trl_grpo.py"), f"--spec={spec_path}",
                         f"--out={trl_dir}"], capture_output=True, text=True)
  if proc.returncode:
    print(proc.stdout[-4000:], proc.stderr[-8000:])
    raise SystemExit(f"TRL's GRPOTrainer failed (exit {proc.returncode}); see above.")
  print(f"trl: {steps} steps in {time.perf_counter() - t0:.0f}s", flush=True)
  trl = json.load(open(os.path.join(trl_dir, "trl_result.json")))
  trl_eval = evaluate_hf(os.path.join(trl_dir, "model"), config)
  trl["eval"] = {k.split("/", 1)[1]: v for k, v in trl_eval.items()}
  trl["seconds_update"] = [s - g for s, g in zip(trl["seconds_step"], trl["seconds_generate"])]

  def rest(x):
    return float(np.mean(x[1:])) if len(x) > 1 else float("nan")

  rows = []
  for name, side in (("spade_jax", ours), ("trl", trl)):
    gen, upd = rest(side["seconds_generate"]), rest(side["seconds_update"])
    rows.append((name, gen, upd, gen + upd, side["seconds_generate"][0] +
                 side["seconds_update"][0]))
  ratio = rows[0][3] / rows[1][3]
  # Our steps 2..N also compile now and then (a new batch width, a narrower decode
  # program): those seconds, measured by JAX's compile events, apart. A rerun with the
  # persistent compilation cache (launch.train's default) loads such programs instead.
  compiled = [ours["seconds_generate_compile"][i] + ours["seconds_update_compile"][i]
              for i in range(len(ours["seconds_update"]))]
  ratio_steady = (rows[0][3] - rest(compiled)) / rows[1][3]
  n = _EVAL_ITEMS.value
  before = ours["eval"]["lenient"]["before"]
  ours_after, trl_after = ours["eval"]["lenient"]["after"], trl["eval"]["lenient"]
  # Unpaired binomial-style interval of the difference of two pass@1 means over n items.
  se = math.sqrt(sum(p * (1 - p) for p in (ours_after, trl_after)) / n)
  diff = ours_after - trl_after
  print("\nreward per step (mean of the step's plays), every 5th step:")
  print("step   " + " ".join(f"{i:>5d}" for i in range(1, steps + 1, 5)))
  for name, r in (("ours", ours["reward"]), ("trl", trl["reward"])):
    print(f"{name:6s} " + " ".join(f"{r[i - 1]:5.2f}" for i in range(1, len(r) + 1, 5)))
  print(f"\nheld-out ({n} items), lenient pass@1 / strict pass@1 / lenient pass@k / "
        "greedy lenient:")
  e = ours["eval"]
  print(f"  start      {before:.3f} / {e['strict']['before']:.3f} / "
        f"{e['lenient@k']['before']:.3f} / {e['greedy/lenient']['before']:.3f}")
  print(f"  spade_jax  {ours_after:.3f} / {e['strict']['after']:.3f} / "
        f"{e['lenient@k']['after']:.3f} / {e['greedy/lenient']['after']:.3f}")
  t = trl["eval"]
  print(f"  trl        {trl_after:.3f} / {t['strict']:.3f} / {t['lenient@k']:.3f} / "
        f"{t['greedy/lenient']:.3f}")
  print(f"  ours - trl after: {diff:+.3f} ± {1.96 * se:.3f} (95%)")
  print("\nseconds per GRPO step (mean of steps 2..N): generation / update / total "
        "(first step)")
  for name, gen, upd, tot, first in rows:
    print(f"  {name:9s} {gen:6.2f} / {upd:6.2f} / {tot:6.2f}   ({first:.1f})")
  print(f"  ours / trl: {ratio:.2f}x the time; {ratio_steady:.2f}x without the "
        f"{rest(compiled):.2f} s a step ours spent compiling in steps 2..N "
        f"({sum(1 for c in compiled[1:] if c >= 1.0)} steps compiled >= 1 s)")
  diff_steps = [u for u, d in zip(ours["seconds_update"][1:], ours["differentiated"][1:]) if d]
  print(f"  ours left {rest(ours['skipped_rows']):.1f} of "
        f"{config.selfplay.num_envs * config.selfplay.plays} rows a step out of the update "
        "(zero advantage: the same update, train.skip_zero_advantage); "
        f"{len(ours['seconds_update']) - 1 - len(diff_steps)} steps had no row left; "
        f"update on the other {len(diff_steps)} steps "
        f"{float(np.mean(diff_steps)) if diff_steps else float('nan'):.2f} s")
  record = {"seed": seed, "steps": steps, "eval_items": n, "ours": ours, "trl": trl,
            "seconds_per_step": {name: {"generate": g, "update": u, "total": tt,
                                        "first": f} for name, g, u, tt, f in rows},
            "time_ratio_ours_over_trl": ratio,
            "time_ratio_ours_over_trl_without_compiles": ratio_steady,
            "ours_compile_seconds_per_step": rest(compiled), "lenient_after_diff": diff,
            "lenient_after_diff_ci95": 1.96 * se,
            "config": json.loads(config.to_json())}
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, f"learn_vs_trl-{seed}-{time.strftime('%Y%m%d-%H%M')}.json")
  json.dump(record, open(path, "w"), indent=1)
  print(f"\nwrote {path}")


if __name__ == "__main__":
  app.run(main)
