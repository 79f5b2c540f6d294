"""The paper's recipes as configs: smoke runs from a Hugging Face checkpoint, dry-run plans,
reproducible workdirs (config guard, kill -9 resume), export, plots, Cloud TPU dry run."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from spade_jax import selfplay
from spade_jax.metrics import read_metrics
from spade_jax.selfplay import build, loop

from experiments.configs import common, games, tool_use

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Facts about a process rather than the run: wall times and compiled-program counts.
PROCESS_KEYS = ("time/", "process/")


def _run_facts(rows):
  return [{k: v for k, v in r.items() if not k.startswith(PROCESS_KEYS)} for r in rows]


def _launch(*args, env=None, **kw):
  env = dict(os.environ, **(env or {}))
  return subprocess.Popen([sys.executable, "-m", "launch.train", "--verbosity=-1", *args],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kw)


@pytest.fixture(scope="module")
def games_run(tmp_path_factory):
  """The games recipe's smoke variant, run through launch.train's library entry."""
  workdir = str(tmp_path_factory.mktemp("games_smoke"))
  last = selfplay.train(games.get_config("smoke"), workdir)
  return workdir, last


def test_games_smoke_starts_from_a_hf_checkpoint_with_bpe(games_run):
  workdir, last = games_run
  saved = json.load(open(os.path.join(workdir, "config.json")))
  assert saved["model.init_from"].startswith("hf:") and saved["selfplay.setting"] == "games"
  ckpt = saved["model.init_from"][3:]
  assert os.path.isfile(os.path.join(ckpt, "model.safetensors"))
  assert os.path.isfile(os.path.join(ckpt, "tokenizer.json"))
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2] and np.isfinite(last["train/loss"])
  assert rows[0]["sampling/hint/temperature"] == 0.3
  # The contamination audit (default mode flag) checked the data path and logged it.
  for r in rows:
    for kind in ("program", "document", "hint", "observation"):
      assert r[f"audit/checked/{kind}"] >= 0 and r[f"audit/flagged/{kind}"] >= 0
    assert r["designer/rejected/contaminated"] == 0 and r["time/audit"] >= 0
  assert rows[0]["audit/checked/program"] == (rows[0]["designer/samples"]
                                              - rows[0]["designer/rejected/no_code"])
  assert rows[0]["audit/checked/observation"] == rows[0]["agent/episodes"] / 2
  assert 0 <= rows[0]["audit/hint/leak_rate"] <= 1
  records = [json.loads(l) for l in open(os.path.join(workdir, "designer_samples.jsonl"))]
  assert records and all(set(r["audit"]) == {"flagged", "dropped", "checked", "notes"}
                         for r in records)
  out = subprocess.run([sys.executable, "-m", "launch.audit", f"--workdir={workdir}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith(f"audit of {workdir}") and "designer samples:" in out.stdout
  rep = json.load(open(os.path.join(workdir, "audit.json")))
  assert rep["samples"]["records"] == rep["samples"]["with_audit"] == len(records)
  assert rep["counts"]["program"]["checked"] >= rep["programs"]
  assert rep["counts"]["document"]["checked"] == sum(r["audit"]["checked"].get("document", 0)
                                                     for r in records) > 0
  assert rep["metrics"]["rows"] == 2
  assert rep["metrics"]["checked"]["program"] == sum(r["audit/checked/program"] for r in rows)


@pytest.mark.parametrize("module,arg", [(tool_use, "smoke"), (games, "smoke,ablation=no_corpus")])
def test_other_recipe_smokes_run(module, arg, tmp_path):
  config = module.get_config(arg)
  config.iterations = 1
  last = selfplay.train(config, str(tmp_path))
  assert np.isfinite(last["train/loss"])
  saved = json.load(open(tmp_path / "config.json"))
  if "no_corpus" in arg:
    assert saved["selfplay.no_corpus"] is True
  else:
    assert saved["selfplay.setting"] == "tool_use"
    row = read_metrics(str(tmp_path))[0]
    # Unhinted and hinted arms through the tool conversation (pool slots: built-in tools).
    assert row["agent/episodes"] == 2 * (2 + 2) and row["agent/hints"] > 0


def test_recipes_carry_the_papers_numbers():
  g = games.get_config("model=qwen3_8b,mesh=v5p-64")
  assert (g.iterations, g.selfplay.num_envs, g.selfplay.plays, g.selfplay.hinted_plays) == \
      (400, 24, 8, 16)
  assert (g.selfplay.regen_every, g.rewards.credit_window, g.loss.kl_coef) == (4, 4, 0.005)
  assert g.selfplay.designer_new_tokens == 20_000 and g.optimizer.learning_rate == 1e-6
  assert games.get_config("").loss.kl_coef == 0.0
  t = tool_use.get_config("model=qwen3_4b")
  assert (t.iterations, t.selfplay.num_envs, t.selfplay.plays, t.selfplay.hinted_plays,
          t.selfplay.regen_every) == (500, 16, 16, 4, 32)
  m = games.get_config("model=qwen3_30b_a3b_instruct_2507,mesh=v5p-64").mesh
  assert (m.expert, m.rules) == (8, "fsdp_tensor_expert")
  for ablation in common.ABLATIONS:
    games.get_config(f"ablation={ablation}")
  assert games.get_config("ablation=two_skills").selfplay.skills == (
      "mathematical reasoning", "pattern recognition")
  with pytest.raises(ValueError, match="Unknown ablation 'nope'"):
    games.get_config("ablation=nope")
  with pytest.raises(ValueError, match="Unknown config argument 'modle'"):
    games.get_config("modle=x")


@pytest.mark.parametrize("arg,params_b", [
    ("model=qwen3_4b_instruct_2507,mesh=v5p-64", 4.0),
    ("model=qwen3_8b,mesh=v5p-64", 8.2),
    ("model=qwen3_30b_a3b_instruct_2507,mesh=v5p-64", 30.5)])
def test_dry_run_plans_a_recipe_without_weights(arg, params_b):
  env = {"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "SPADE_JAX_CHECKPOINTS": "/nonexistent"}
  p = _launch(f"--config=experiments/configs/games.py:{arg}", "--dry_run", "--json", env=env)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0, out[-2000:]
  plan = json.loads(out[out.index("{"):])
  assert plan["devices"] == 32 and abs(plan["parameters"] / 1e9 - params_b) < 0.1
  # fp32 master weights and two Adam moments, sharded over 32 devices.
  np.testing.assert_allclose(plan["opt_state_gib"], 2 * plan["params_gib"], rtol=0.02)
  assert plan["params_gib"] < 4 * params_b * 1.1 / 32 * 1.3
  assert (plan["ref_params_gib"] > 0) == ("8b" in arg)  # KL 0.005 keeps a reference copy


def test_mismatched_model_and_checkpoint_fail_before_allocating(tmp_path):
  ckpt = common.tiny_hf_checkpoint()
  config = games.get_config("smoke")
  config.model.d_model = 128
  with pytest.raises(ValueError, match=r"d_model: config 128 vs checkpoint 64"):
    build.resolve(config)
  config = games.get_config("smoke")
  config.model.init_from = "hf:" + str(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    build.resolve(config)
  config = games.get_config("smoke")
  config.tokenizer = "byte"
  config.model.vocab_size = 100
  with pytest.raises(ValueError, match="vocab_size"):
    build.resolve(config)
  assert os.path.isdir(ckpt)


def test_a_workdir_refuses_a_different_config(tmp_path):
  config = games.get_config("smoke")
  loop.check_config(config, build_path(tmp_path))
  config.iterations = 7  # may change on a rerun
  loop.check_config(config, build_path(tmp_path))
  config.seed, config.selfplay.plays = 3, 4
  with pytest.raises(ValueError, match=r"2 key\(s\) differ: seed: 0 -> 3; selfplay.plays"):
    loop.check_config(config, build_path(tmp_path))


def build_path(p):
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(str(p))


def test_kill_minus_nine_resumes_to_the_same_metrics(tmp_path):
  """SIGKILL at a random moment after the first checkpoint; the resumed run's metrics and
  designer records equal an uninterrupted run's. Every run goes through the multi-host
  entry with one local process; all share one compilation cache, so the reference and
  resumed runs load programs the first one wrote."""
  ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "killed")
  xla_cache = tmp_path / "xla"

  def args(workdir):
    with socket.socket() as s:
      s.bind(("localhost", 0))
      port = s.getsockname()[1]
    return ["--config=experiments/configs/tiny.py:smoke", "--config.iterations=2",
            f"--workdir={workdir}", "--multihost", f"--coordinator_address=localhost:{port}",
            "--num_processes=1", "--process_id=0", f"--compilation_cache={xla_cache}",
            "--compilation_cache_min_s=0"]

  p = _launch(*args(run_dir))
  first = os.path.join(run_dir, "checkpoints", "1")
  deadline = time.time() + 600
  while not os.path.isdir(first) and p.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  assert os.path.isdir(first), p.communicate()[0][-3000:]
  assert len(os.listdir(xla_cache)) > 5  # the step and sampler programs, written as compiled
  time.sleep(random.Random(os.getpid()).uniform(0.0, 8.0))
  killed = p.poll() is None
  p.send_signal(signal.SIGKILL)
  p.communicate()
  ref = _launch(*args(ref_dir))
  resumed = _launch(*args(run_dir))
  out_ref, out_res = ref.communicate(timeout=900)[0], resumed.communicate(timeout=900)[0]
  assert ref.returncode == 0, out_ref[-3000:]
  assert resumed.returncode == 0, out_res[-3000:]
  assert "resumed from" in out_res or not killed
  a, b = read_metrics(ref_dir), read_metrics(run_dir)
  assert [r["step"] for r in b] == [1, 2]
  assert _run_facts(a) == _run_facts(b)
  assert read_metrics(ref_dir, "designer_samples") == read_metrics(run_dir, "designer_samples")


def test_export_round_trip_reproduces_logits_in_transformers(games_run, tmp_path):
  torch = pytest.importorskip("torch")
  tf = pytest.importorskip("transformers")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spade_jax.models import forward  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  workdir, _ = games_run
  out = str(tmp_path / "hf")
  p = subprocess.run([sys.executable, "-m", "launch.export", f"--workdir={workdir}",
                      f"--hf_out={out}"], cwd=REPO, capture_output=True, text=True,
                     env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"), check=False)
  assert p.returncode == 0, p.stderr[-3000:]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
  c, vocab, params, step = workdir_lib.load_run(workdir)
  assert step == 2
  ids = vocab.encode("Hello, designer! Write a puzzle.")
  ours, _ = forward(params, c.model, jnp.array([ids]), jnp.arange(len(ids))[None],
                    jnp.tril(jnp.ones((1, len(ids), len(ids)), bool)))
  model = tf.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(np.asarray(jax.device_get(ours)), theirs, atol=2e-4)


def test_plots_are_written(games_run, tmp_path):
  workdir, _ = games_run
  out = tmp_path / "plots"
  p = subprocess.run([sys.executable, "-m", "launch.plot", f"--workdir={workdir}",
                      f"--out={out}"], cwd=REPO, capture_output=True, text=True, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  names = {"designer_valid.png", "regret.png", "reward.png", "reward_by_skill.png",
           "loss.png", "kl.png", "clip.png"}
  assert names == set(os.listdir(out))
  for n in names:
    assert open(out / n, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_tpu_launcher_dry_run_prints_the_gcloud_commands():
  p = subprocess.run(
      [sys.executable, "-m", "launch.tpu.run", "--name=spade-t", "--zone=us-east5-a",
       "--accelerator=v5p-64", "--queued",
       "--config=experiments/configs/games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64",
       "--workdir=gs://bucket/run", "--checkpoint=gs://bucket/ckpt/Qwen3-4B-Instruct-2507",
       "--dry_run"], cwd=REPO, capture_output=True, text=True, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  lines = [ln[len("[tpu] $ "):] for ln in p.stdout.splitlines() if ln.startswith("[tpu] $ ")]
  assert lines[0].startswith("gcloud compute tpus queued-resources create spade-t "
                             "--node-id=spade-t --accelerator-type=v5p-64")
  assert lines[1].startswith("gcloud compute tpus tpu-vm scp --recurse ")
  assert "--worker=all" in lines[2] and "bubblewrap" in lines[2]
  assert "gcloud storage cp -r gs://bucket/ckpt/Qwen3-4B-Instruct-2507" in lines[2]
  assert ("python3 -m launch.train --multihost" in lines[3]
          and "--workdir=gs://bucket/run" in lines[3])
  assert lines[4].startswith("gcloud compute tpus queued-resources delete spade-t --force")
  bad = subprocess.run([sys.executable, "-m", "launch.tpu.run", "--name=x", "--zone=z",
                        "--config=c", "--workdir=/tmp/local", "--dry_run"], cwd=REPO,
                       capture_output=True, text=True, check=False)
  assert bad.returncode != 0 and "gs://" in bad.stderr


def test_notebook_runs_top_to_bottom(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  path = os.path.join(REPO, "experiments", "notebooks", "spade_tiny.ipynb")
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.dirname(path)}})
  # The notebook's run directory (`tempfile.mkdtemp`) goes under the test's folder.
  client.execute(env={**os.environ, "TMPDIR": str(tmp_path)})
  assert [p for p in tmp_path.iterdir() if p.name.startswith("spade_tiny_")]
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.output_type == "error"]
  assert sum(1 for o in outputs if "image/png" in o.get("data", {})) == 7
