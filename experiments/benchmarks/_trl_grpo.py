"""TRL's GRPOTrainer on a prepared problem stream: the peer side of learn_vs_trl.py.

Runs in the peers environment (.venv-peers: torch, transformers, trl), never imports
spade_jax (its answer reading, `spade_jax/sandbox/worker/actions.py`, is standard-library
code and is loaded from its file so both sides pay the same reward for the same text).

  .venv-peers/bin/python experiments/benchmarks/_trl_grpo.py --spec=SPEC.json --out=DIR

SPEC.json: {"model": HF dir, "problems": [{"prompt": text, "prompt_ids": [...],
"answer": str}, ...] (in training order, `prompts_per_step` per step), "steps",
"prompts_per_step", "group", "lr", "temperature", "max_new_tokens", "seed", "lenient":
path of the answer parser, spade_jax/sandbox/worker/actions.py}. Writes DIR/model (the trained weights, HF format) and
DIR/trl_result.json (per-step reward, seconds per step split into generation and update,
prompt-token agreement with spade_jax's ids).
"""

import argparse
import importlib.util
import json
import os
import time


def _lenient(path):
  spec = importlib.util.spec_from_file_location("spade_lenient", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--spec", required=True)
  ap.add_argument("--out", required=True)
  args = ap.parse_args()
  spec = json.load(open(args.spec))
  import datasets  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(os.cpu_count() or 1)
  lenient = _lenient(spec["lenient"])
  tok = transformers.AutoTokenizer.from_pretrained(spec["model"])
  same = sum(tok(p["prompt"], add_special_tokens=False)["input_ids"] == p["prompt_ids"]
             for p in spec["problems"])
  model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"],
                                                            dtype=torch.float32)
  data = datasets.Dataset.from_list([{"prompt": p["prompt"], "answer": p["answer"]}
                                     for p in spec["problems"]])

  def reward(prompts, completions, answer, **kw):
    del prompts, kw
    return [1.0 if lenient.score(c, a)["lenient"] else 0.0
            for c, a in zip(completions, answer)]

  n = spec["prompts_per_step"] * spec["group"]
  cfg = trl.GRPOConfig(
      output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=n,
      num_generations=spec["group"], max_completion_length=spec["max_new_tokens"],
      temperature=spec["temperature"], top_k=0, top_p=1.0, learning_rate=spec["lr"],
      lr_scheduler_type="constant", weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.98,
      adam_epsilon=1e-8, max_grad_norm=1.0, beta=0.0, loss_type="dapo",
      scale_rewards="group", epsilon=0.2, epsilon_high=0.28, num_iterations=1,
      steps_per_generation=1, max_steps=spec["steps"], shuffle_dataset=False,
      use_cpu=True, bf16=False, fp16=False, logging_steps=1, save_strategy="no",
      report_to="none", seed=spec["seed"], disable_dropout=True)
  times = {"generate": [], "step": []}

  class Timed(trl.GRPOTrainer):

    def _generate_and_score_completions(self, inputs):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(inputs)
      times["generate"].append(time.perf_counter() - t0)
      return out

    def training_step(self, *a, **k):
      t0 = time.perf_counter()
      out = super().training_step(*a, **k)
      times["step"].append(time.perf_counter() - t0)
      return out

  trainer = Timed(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                  processing_class=tok)
  t0 = time.perf_counter()
  trainer.train()
  total = time.perf_counter() - t0
  rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
  trainer.save_model(os.path.join(args.out, "model"))
  tok.save_pretrained(os.path.join(args.out, "model"))
  result = {"versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__, "threads": torch.get_num_threads()},
            "reward": rewards, "seconds_generate": times["generate"],
            "seconds_step": times["step"], "seconds_total": total,
            "prompt_ids_equal": same, "prompts": len(spec["problems"])}
  json.dump(result, open(os.path.join(args.out, "trl_result.json"), "w"), indent=1)


if __name__ == "__main__":
  main()
