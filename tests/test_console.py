"""The console: bad input as one stderr line and exit 2, bugs with their traceback, a run's
progress lines once each, library chatter held back unless --verbosity asks for it."""

import os
import subprocess
import sys
import textwrap

from absl import app
from absl import logging
import pytest

from spade_jax import console
from spade_jax.registry import UnknownNameError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "experiments/configs/tiny.py"


def _env(**extra):
  env = dict(os.environ, **{"XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", **extra})
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the launcher's own default is under test
  return env


def _run(*args, timeout=300, env=None):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=_env(**(env or {})), check=False)


# (launcher arguments, what the one stderr line says)
BAD_INPUT = [
    (["launch.check_env", "/nonexistent/program.py"],
     "launch.check_env: /nonexistent/program.py: No such file or directory"),
    (["launch.check_env", "experiments"], "launch.check_env: experiments: Is a directory"),
    (["launch.export", "--workdir=/nonexistent/run", "--hf_out=/tmp/unused"],
     "launch.export: /nonexistent/run/config.json does not exist"),
    (["launch.plot", "--workdir=/nonexistent/run"], "launch.plot: No metrics in '/nonexistent/run'"),
    (["launch.plot"], "launch.plot: Pass --workdir."),
    (["launch.prompts", "--max_chars=500"],
     "launch.prompts: --max_chars=500: The designer prompt needs"),
    # Without --config the default file's overrides are applied at import.
    (["launch.train", "--config.iteratons=1"],
     f"launch.train: --config.iteratons: {TINY} has no key 'iteratons'; "
     "did you mean --config.iterations?"),
    (["launch.train", f"--config={TINY}:smoke", "--config.model.d_modle=3"],
     f"launch.train: --config.model.d_modle: {TINY}:smoke has no key 'model.d_modle'; "
     "did you mean --config.model.d_model?"),
    (["launch.train", "--config=experiments/configs/nope.py"],
     "launch.train: --config=experiments/configs/nope.py: cannot load it ([Errno 2] No such "
     "file or directory"),
    (["launch.train", "--config=experiments/configs/nope.py", "--config.iterations=2"],
     "launch.train: --config=experiments/configs/nope.py: cannot load it"),
    (["launch.train", f"--config={TINY}:smok"],
     "Unknown tiny config variant 'smok'; valid: '' or 'smoke'."),
    (["launch.train", "--config.iterations=abc"],
     "launch.train: flag --config.iterations=abc: invalid literal for int()"),
    (["launch.train", "--workdri=/tmp/x"],
     "launch.train: Unknown command line flag 'workdri'. Did you mean: workdir ?"),
    (["launch.generate", "--init_from=hf:/nonexistent/ckpt", "--prompt=hi"],
     "launch.generate: --init_from='hf:/nonexistent/ckpt': '/nonexistent/ckpt' is not a "
     "directory."),
    (["launch.train", "--config=experiments/configs/games.py:smoke",
      "--config.model.init_from=hf:/nonexistent/ckpt", "--workdir=/tmp/unused_console_run"],
     "launch.train: model.init_from='hf:/nonexistent/ckpt': '/nonexistent/ckpt' is not a "
     "directory."),
]


@pytest.mark.parametrize("args,expected", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_stderr_line_and_exit_2(args, expected):
  p = _run("-m", *args)
  assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
  assert "Traceback" not in p.stderr
  lines = p.stderr.splitlines()
  assert len(lines) == 1, p.stderr[-3000:]
  assert expected in lines[0], lines[0]


_SCRIPT = textwrap.dedent("""\
    import sys
    from absl import flags
    from spade_jax import console
    flags.DEFINE_string("path", None, "A path.")

    def main(argv):
      kind = argv[1]
      if kind == "bug":
        raise RuntimeError("a bug")
      if kind == "unnamed_path":
        open("/nonexistent/internal/file")
      if kind == "named_path":
        open(flags.FLAGS.path)
      if kind == "status":
        return 3
      print("ok")

    console.run(main)
""")


@pytest.mark.parametrize("kind,code,traceback", [
    ("bug", 1, True), ("unnamed_path", 1, True), ("named_path", 2, False),
    ("status", 3, False), ("fine", 0, False)])
def test_bugs_keep_their_traceback_and_statuses_pass_through(kind, code, traceback, tmp_path):
  script = tmp_path / "prog.py"
  script.write_text(_SCRIPT)
  p = _run(str(script), "--path=/nonexistent/given.txt", kind, timeout=120)
  assert p.returncode == code, p.stderr[-2000:]
  assert ("Traceback" in p.stderr) == traceback, p.stderr[-2000:]
  if kind == "named_path":
    assert p.stderr == "prog.py: /nonexistent/given.txt: No such file or directory\n"


def test_bad_input_message_needs_the_path_on_the_command_line():
  argv = ["prog", "--workdir=runs/a", "--suites=gpqa,mmlu", "--init_from=hf:/ckpt/q3"]
  err = FileNotFoundError(2, "No such file or directory", os.path.abspath("runs/a/x.json"))
  assert console.bad_input_message(err, argv) == \
      f"{os.path.abspath('runs/a/x.json')}: No such file or directory"
  assert console.bad_input_message(FileNotFoundError("'/ckpt/q3' is not a directory"), argv)
  assert console.bad_input_message(FileNotFoundError("/etc/internal missing"), argv) is None
  assert console.bad_input_message(UnknownNameError("Unknown eval suite 'mmlu'"), argv)
  assert console.bad_input_message(ValueError("runs/a holds a different config"), argv) is None
  assert console.bad_input_message(RuntimeError("x"), argv) is None
  assert console.bad_input_message(console.BadInput("two\nlines"), argv) == "two lines"
  assert "--helpshort" in console.bad_input_message(app.UsageError("Pass --workdir."), argv)


def test_config_key_problem_suggests_the_nearest_key():
  import ml_collections  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict({"iterations": 3, "model": {"d_model": 64, "n_layers": 2}})
  assert console.config_key_problem("config", ["p", "--config.model.d_model=8"], cfg) is None
  msg = console.config_key_problem("config", ["p", "--config.model.n_layer=1"], cfg)
  assert msg == ("--config.model.n_layer: the config has no key 'model.n_layer'; did you "
                 "mean --config.model.n_layers?")
  msg = console.config_key_problem("config", ["p", "--config.zzz=1"], cfg)
  assert msg.endswith("its top-level keys: iterations, model")
  assert console.config_key_problem("config", ["p", "--other.zzz=1"], cfg) is None


def test_one_line_keeps_the_ends_of_a_traceback():
  text = "flag --config=x: Error:\n\n  Traceback (most recent call last):\n  File y\nValueError: z"
  assert console.one_line(text) == "flag --config=x: Error: ValueError: z"
  assert console.one_line("a\n  b\n") == "a b"


def test_hushed_holds_output_back_unless_verbose(capfd):
  before = logging.get_verbosity()
  try:
    logging.set_verbosity(logging.WARNING)
    with console.hushed():
      print("python chatter")
      os.write(2, b"native chatter\n")
    with pytest.raises(RuntimeError), console.hushed():
      print("said before failing")
      raise RuntimeError("boom")
    out, err = capfd.readouterr()
    assert "chatter" not in out + err
    assert "said before failing" in err  # a failing block's output is shown
    logging.set_verbosity(logging.INFO)
    with console.hushed():
      print("python chatter")
      os.write(2, b"native chatter\n")
    out, err = capfd.readouterr()
    assert "python chatter" in out and "native chatter" in err
  finally:
    logging.set_verbosity(before)


def test_a_run_prints_its_progress_once_and_hides_library_chatter(tmp_path):
  # The smoke config, one iteration, shorter texts: fewer programs to compile.
  shrink = ["--config.iterations=1", "--config.selfplay.max_turns=1",
            "--config.selfplay.designer_prompt_tokens=768", "--config.train.seq_len=1024",
            "--config.selfplay.designer_new_tokens=16", "--config.selfplay.agent_turn_tokens=8",
            "--config.selfplay.hint_tokens=8"]
  p = _run("-m", "launch.train", f"--config={TINY}:smoke", *shrink,
           f"--workdir={tmp_path / 'run'}", timeout=600,
           env={"XLA_FLAGS": "--xla_backend_optimization_level=0"})
  out = p.stdout + p.stderr
  assert p.returncode == 0, out[-3000:]
  lines = out.splitlines()
  for prefix in ("run: ", "sandbox: ", "sampling: ", "  iter 1: design + validate ...",
                 "  iter 1: train ...", "iter 1/1 | design valid"):
    assert sum(ln.startswith(prefix) for ln in lines) == 1, (prefix, out[-3000:])
  assert sum("iter 1/1 | design valid" in ln for ln in lines) == 1  # not also as a log line
  for chatter in ("CheckpointManagerOptions", "Downloading and preparing dataset",
                  "Generating splits", "port.cc", "absl::InitializeLog", "Unable to initialize"):
    assert chatter not in out, chatter
  assert len(lines) < 20, out
