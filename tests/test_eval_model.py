"""The suites on a real (tiny, random) model through our KV-cache sampler."""

import os

import jax
import pytest

from spade_jax import eval as ev
from spade_jax import models, sampling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "eval")
TOKENIZER = os.path.join(ROOT, "experiments", "tokenizers", "tiny_bpe_4k")


@pytest.fixture(scope="module")
def tiny():
  """(policy, chat): a random 2-layer Qwen3 with the 4,096-id BPE vocabulary."""
  vocab = models.HFTokenizer(TOKENIZER)
  cfg = models.get_preset("tiny", vocab_size=4096)
  rule = sampling.SamplingConfig(eos_id=vocab.eos_id, pad_id=vocab.pad_id)
  policy = sampling.Sampler(models.init_params(jax.random.key(0), cfg), cfg, rule,
                            jax.random.key(0), detokenize=vocab.decode)
  return policy, models.ChatTemplate(vocab, thinking=False)


@pytest.mark.slow
def test_completions_do_not_depend_on_the_batch(tiny):
  policy, chat = tiny
  prompts = [chat.prompt(None, q) for q in ("2+2?", "Name a colour.", "Count to three.")]
  cfg = ev.suite_config("aime", {"samples": 2, "max_new_tokens": 6, "batch_size": 2})
  one_row = ev.complete(policy, cfg, prompts)
  many = ev.complete(policy, ev.suite_config("aime", {"samples": 2, "max_new_tokens": 6,
                                                      "batch_size": 4}), prompts)
  assert [o[0] for o in one_row] == [o[0] for o in many]
  assert len(one_row) == 6 and all(0 < len(o[0]) <= 6 for o in one_row)
  assert one_row[0][0] != one_row[1][0]  # T 1.0: the two samples of an item differ


@pytest.mark.slow
def test_every_suite_runs_on_the_tiny_model(tiny):
  policy, chat = tiny
  small = dict(max_new_tokens=8, batch_size=4)
  configs = {
      "reasoning_gym": dict(tasks=1, samples=2, **small),
      "bfcl": dict(categories=("base", "miss_func"), limit=1, max_len=16384, **small),
      "humaneval": dict(limit=2, **small),
      "aime": dict(path=os.path.join(FIXTURES, "aime_sample.jsonl"), limit=2, samples=2,
                   **small),
      "gpqa": dict(data_dir=FIXTURES, samples=2, **small),
      "livecodebench": dict(data_dir=FIXTURES, **small),
  }
  results = ev.evaluate(policy, chat, list(configs), configs)
  records = {"reasoning_gym": 4, "bfcl": 2, "humaneval": 2, "aime": 2, "gpqa": 2,
             "livecodebench": 2}
  for name, result in results.items():
    assert result.scores and all(0.0 <= v <= 1.0 for v in result.scores.values()), name
    assert len(result.records) == records[name], name
  flat = ev.run_suites(policy, chat, ["gpqa"], {"gpqa": configs["gpqa"]})
  assert list(flat) == ["gpqa/pass@1"]
