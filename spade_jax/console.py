"""What a person sees on the console: the run's own lines once, bad input as one line.

Every launcher (`launch/*.py`) ends in :func:`run`, which stands in for absl's `app.run`:

* **Verbosity.** `app.run` raises logging to INFO when `--verbosity` is not given; :func:`run`
  keeps absl's own default (WARNING) instead. The console then holds the lines a run prints
  for the person (progress, summaries; on stdout) and warnings. `--verbosity=0` brings back
  the INFO logs: orbax's checkpoint chatter, the sampler's compile lines, and the output that
  :func:`hushed` holds back (tfds building the embedded corpus, TensorFlow's native start-up
  lines, JAX's warnings about failed compilation-cache writes).
* **Bad input** ends the program with one line on stderr, `<launcher>: <message>`, and exit
  status 2 instead of a traceback. Bad input is:

  - :class:`BadInput` (raised by a launcher) and absl's `app.UsageError`;
  - a flag that does not parse: an unknown flag, a value of the wrong type, a config file
    that fails to load, a `--config.` key the config does not have (with a "did you mean"
    over the config's keys; :func:`define_config_file` catches it when ml_collections finds
    it while the flag is defined, at import);
  - a `FileNotFoundError`, `NotADirectoryError`, `IsADirectoryError`, `PermissionError` or
    unknown registry name (`registry.UnknownNameError`) whose message names a value given
    on the command line (a missing program file, workdir or checkpoint; `--suites=mmlu`).

  Anything else is a bug and keeps its traceback.

Library code never reads flags: it asks :func:`verbose` (the Python logging level) whether
to show library output.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import os
import re
import sys
import tempfile
import warnings
from typing import Any, Callable, Iterator

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_dict
from ml_collections import config_flags
# The config file parser (what DEFINE_config_file uses), to read a config for its keys.
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from spade_jax.registry import UnknownNameError

FLAGS = flags.FLAGS
EXIT_BAD_INPUT = 2
# Errors about a path; bad input when the path is one the command line names.
_PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

# Problems found while a config flag was being defined (at import), reported by `run`.
_PENDING: list[str] = []


class BadInput(Exception):
  """Input the person can fix; :func:`run` prints the message as one line and exits 2."""


def verbose() -> bool:
  """Whether INFO logs show (``--verbosity=0`` under :func:`run`; ``logging`` level INFO)."""
  return absl_logging.get_absl_logger().getEffectiveLevel() <= logging.INFO


@contextlib.contextmanager
def hushed() -> Iterator[None]:
  """Holds back what the block writes to stdout and stderr unless :func:`verbose`.

  For libraries that print rather than log (tfds's "Downloading and preparing dataset" and
  progress bars) and native code that writes to the file descriptors (TensorFlow's start-up
  lines). Both Python's streams and file descriptors 1 and 2 are redirected, so the block
  should be short and on the main thread: another thread's output in that window is held
  back too. If the block raises, what it wrote goes to stderr before the exception.
  """
  if verbose():
    yield
    return
  with tempfile.TemporaryFile(mode="w+", errors="replace") as sink:
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    saved = []
    try:
      for fd in (1, 2):
        saved.append((fd, os.dup(fd)))
        os.dup2(sink.fileno(), fd)
    except OSError:  # no such descriptor (e.g. a closed stdout): Python streams only
      pass
    failed = False
    try:
      with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
    except BaseException:
      failed = True
      raise
    finally:
      sink.flush()
      for fd, copy in saved:
        os.dup2(copy, fd)
        os.close(copy)
      if failed:
        sink.seek(0)
        sys.stderr.write(sink.read())
        sys.stderr.flush()


def one_line(message: Any) -> str:
  """A message as one line; of a traceback text, its first and last lines."""
  lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
  if any(ln.startswith("Traceback") for ln in lines):
    lines = [lines[0], lines[-1]] if not lines[0].startswith("Traceback") else lines[-1:]
  return " ".join(lines)


def _dotted_keys(config: Any, prefix: str = "") -> Iterator[str]:
  for key, value in config.items():
    yield prefix + key
    if isinstance(value, (config_dict.ConfigDict, dict)):
      yield from _dotted_keys(value, f"{prefix}{key}.")


def _config_spec(name: str, argv: list[str], default: Any) -> Any:
  """The last ``--name=SPEC`` on the command line, else the flag's default."""
  spec = default
  for arg in argv[1:]:
    m = re.match(rf"^--?{re.escape(name)}=(.*)$", arg)
    if m:
      spec = m.group(1)
  return spec


def config_key_problem(name: str, argv: list[str], spec: Any) -> str | None:
  """The first ``--name.KEY`` override in ``argv`` whose KEY the config lacks, as a message.

  Args:
    name: the config flag's name (``config``).
    argv: the command line.
    spec: the config file (``path[:arg]``) or an already loaded ConfigDict.

  Returns:
    e.g. ``--config.iteratons: experiments/configs/tiny.py has no key 'iteratons'; did you
    mean --config.iterations?``, or None when every key exists or the config does not load.
  """
  paths = []
  for arg in argv[1:]:
    m = re.match(rf"^--?(?:no)?{re.escape(name)}\.([^=]+)", arg)
    if m:
      paths.append(m.group(1))
  if not paths:
    return None
  config = spec
  if isinstance(spec, str):
    try:
      config = ConfigFileFlagParser(name, lock_config=False).parse(spec)
    except Exception:  # pylint: disable=broad-except
      return None  # the load failure itself is reported where it happens
  if not isinstance(config, (config_dict.ConfigDict, dict)):
    return None
  keys = sorted(_dotted_keys(config))
  for path in paths:
    if path in keys:
      continue
    where = spec if isinstance(spec, str) else "the config"
    close = difflib.get_close_matches(path, keys, n=1, cutoff=0.6)
    if close:
      hint = f"did you mean --{name}.{close[0]}?"
    else:
      hint = "its top-level keys: " + ", ".join(k for k in keys if "." not in k)
    return f"--{name}.{path}: {where} has no key {path!r}; {hint}"
  return None


def define_config_file(name: str, default: str | None = None,
                       help_string: str = "path to config file.", **kwargs) -> Any:
  """``config_flags.DEFINE_config_file``, whose mistyped overrides :func:`run` reports.

  Without ``--name=FILE`` on the command line, ml_collections loads the default file and
  applies the ``--name.KEY=...`` overrides while the flag is defined, i.e. when the launcher
  is imported, before :func:`run` starts. A KEY the config lacks is kept here and reported
  by :func:`run` (the returned holder is then None and never read).
  """
  try:
    return config_flags.DEFINE_config_file(name, default, help_string, **kwargs)
  except (AttributeError, KeyError):
    problem = config_key_problem(name, sys.argv, default)
    if problem is None:
      raise
    _PENDING.append(problem)
    return None


def _config_flags() -> list[flags.Flag]:
  return [f for f in FLAGS._flags().values()  # pylint: disable=protected-access
          if isinstance(f.parser, ConfigFileFlagParser)]


def _load_problem(argv: list[str]) -> str | None:
  """A config flag whose file failed to load (ml_collections raises only when it is read)."""
  for flag in _config_flags():
    try:
      flag.value.keys()
    except OSError as e:
      spec = _config_spec(flag.name, argv, flag.default)
      return f"--{flag.name}={spec}: cannot load it ({str(e).splitlines()[-1].strip()})"
    except AttributeError:  # not loaded at all (its parse failed)
      pass
  return None


def _config_problem(argv: list[str]) -> str | None:
  """After a failed parse: a ``--config.`` key the config lacks, or a file that fails."""
  for flag in _config_flags():
    spec = _config_spec(flag.name, argv, flag.default)
    problem = config_key_problem(flag.name, argv, spec)
    if problem:
      return problem
    if isinstance(spec, str):
      try:
        ConfigFileFlagParser(flag.name, lock_config=False).parse(spec).keys()
      except OSError as e:
        return f"--{flag.name}={spec}: cannot load it ({str(e).splitlines()[-1].strip()})"
      except Exception:  # pylint: disable=broad-except
        pass  # reported by the flag's own error
  return _load_problem(argv)


def _fail(prog: str, message: Any) -> None:
  print(f"{prog}: {one_line(message)}", file=sys.stderr, flush=True)
  sys.exit(EXIT_BAD_INPUT)


def _parse_flags(prog: str, argv: list[str]) -> list[str]:
  """absl's flag parsing, with one-line errors and absl's default verbosity kept."""
  try:
    rest = FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, OSError) as e:
    problem = _config_problem(argv)
    if problem is None and not isinstance(e, flags.Error):
      raise
    _fail(prog, problem or e)
  problem = _load_problem(argv)
  if problem:
    _fail(prog, problem)
  if FLAGS["verbosity"].using_default_value:
    # app.run would raise it to INFO; set, it stays at absl's own default (WARNING).
    FLAGS.verbosity = -1
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Runs that share a compilation cache race on its eviction timestamps; a failed cache
    # write only costs a later compile, so JAX's warning about it is chatter here.
    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache",
                            category=UserWarning)
  return rest


def _given_values(argv: list[str]) -> set[str]:
  """Values given on the command line, as they may appear in a message (paths absolute too)."""
  out = set()
  for arg in argv[1:]:
    if arg.startswith("-"):
      if "=" not in arg:
        continue
      arg = arg.split("=", 1)[1]
    for part in {arg, *arg.split(","), *arg.split(":")}:
      part = part.strip()
      if len(part) < 2 or re.fullmatch(r"[-+.\d]+|true|false", part, re.I):
        continue
      out.add(part)
      if "://" not in part:
        out.add(os.path.abspath(os.path.expanduser(part)))
        out.add(os.path.realpath(os.path.expanduser(part)))
  return out


def bad_input_message(e: BaseException, argv: list[str]) -> str | None:
  """The one-line message for an exception that counts as bad input, else None (a bug)."""
  if isinstance(e, BadInput):
    return one_line(e)
  if isinstance(e, app.UsageError):
    return one_line(f"{e} (--helpshort lists the flags)")
  if isinstance(e, _PATH_ERRORS + (UnknownNameError,)):
    text = f"{e} {getattr(e, 'filename', None) or ''}"
    # A whole value, not part of a word (`--prompt=hi` is not named by "this").
    if any(re.search(rf"(?<![\w.-]){re.escape(v)}(?![\w-])", text)
           for v in _given_values(argv)):
      if isinstance(e, OSError) and e.filename and e.strerror and str(e).startswith("["):
        return f"{e.filename}: {e.strerror}"
      return one_line(e)
  return None


def run(main: Callable[[list[str]], int | None]) -> None:
  """Runs ``main`` as absl's ``app.run`` does, with the console described above."""
  spec = main.__globals__.get("__spec__")
  prog = spec.name if spec is not None else os.path.basename(sys.argv[0])
  if _PENDING:
    _fail(prog, _PENDING[0])

  @functools.wraps(main)
  def guarded(argv):
    try:
      return main(argv)
    except Exception as e:  # pylint: disable=broad-except
      message = bad_input_message(e, sys.argv)
      if message is None:
        raise
      _fail(prog, message)

  app.run(guarded, flags_parser=functools.partial(_parse_flags, prog))
