"""`python -m launch.eval` end to end on a tiny HF checkpoint, and its error messages."""

import json
import os
import subprocess
import sys

import jax
import pytest

from spade_jax import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "eval")
TOKENIZER = os.path.join(ROOT, "experiments", "tokenizers", "tiny_bpe_4k")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A tiny random Qwen3 written as a Hugging Face checkpoint with the 4k BPE tokenizer."""
  directory = str(tmp_path_factory.mktemp("tiny_hf"))
  cfg = models.get_preset("tiny", vocab_size=4096)
  models.save_hf(directory, models.init_params(jax.random.key(0), cfg), cfg)
  models.copy_tokenizer_files(TOKENIZER, directory)
  return directory


def _launch(*args):
  return subprocess.run([sys.executable, "-m", "launch.eval", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)


def test_launch_eval_writes_a_json_report(checkpoint, tmp_path):
  report = tmp_path / "report.json"
  out = _launch(f"--hf_checkpoint={checkpoint}", "--suites=gpqa", f"--data_dir={FIXTURES}",
                "--limit=1", "--samples=2", "--max_new_tokens=4", "--thinking=false", "--json",
                f"--report={report}")
  assert out.returncode == 0, out.stderr[-3000:]
  printed = json.loads(out.stdout)
  assert printed == json.loads(report.read_text())
  assert printed["model"] == {"hf_checkpoint": checkpoint}
  assert set(printed["scores"]) == {"gpqa/pass@1"}
  assert 0.0 <= printed["scores"]["gpqa/pass@1"] <= 1.0
  suite = printed["suites"]["gpqa"]
  assert suite["config"]["samples"] == 2 and suite["config"]["temperature"] == 0.7
  [record] = suite["records"]
  assert len(record["predictions"]) == len(record["texts"]) == 2
  assert "gpqa" in out.stderr and "2/2" in out.stderr  # the progress line


def test_launch_eval_errors_name_the_problem_and_the_fix(checkpoint, tmp_path):
  out = _launch(f"--hf_checkpoint={checkpoint}", "--suites=gpqa,mmlu")
  assert out.returncode != 0
  assert "Unknown eval suite 'mmlu'" in out.stderr and "'reasoning_gym'" in out.stderr
  out = _launch(f"--hf_checkpoint={tmp_path / 'missing'}", "--suites=humaneval")
  assert out.returncode != 0 and "is not a directory" in out.stderr
  bad = tmp_path / "gpqa_diamond.jsonl"
  bad.write_text('{"Question": "q", "Correct Answer": "a"}\n')
  out = _launch(f"--hf_checkpoint={checkpoint}", "--suites=gpqa", f"--data_dir={tmp_path}")
  assert out.returncode != 0
  assert f"{bad}:1: missing field 'Incorrect Answer 1'" in out.stderr
