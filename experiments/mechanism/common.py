"""What every part of the mechanism experiment shares: model, tokenizer, families, paths."""

from __future__ import annotations

import os

from spade_jax.envs.families import FAMILIES, HELD_OUT, by_skill, seen_families

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
# The staged warm start's finished stages (weights, tokenizer, records), committed so a
# build goes on from any checkout (``warm_start --store``).
STORE = os.path.join(HERE, "stages")
# The arm runs not yet finished, at their latest checkpoint (``run --publish``), committed
# so a run longer than one sitting goes on from any checkout.
RUN_STORE = os.path.join(HERE, "stored_runs")

# A Qwen3-shaped decoder of about 10.5M parameters (8 layers, width 320, GQA 5/1 heads,
# tied 6,144-id embedding).
MODEL = dict(vocab_size=6144, d_model=320, num_layers=8, num_heads=5, num_kv_heads=1,
             head_dim=64, mlp_dim=864, tie_embeddings=True, max_position_embeddings=4096)
SMOKE_MODEL = dict(MODEL, d_model=64, num_layers=2, num_heads=2, num_kv_heads=1,
                   head_dim=32, mlp_dim=128)
VOCAB_SIZE = MODEL["vocab_size"]

SETTING = "games"
DESIGNER_PROMPT_TOKENS = 1024  # the run's designer prompt budget (chat markup included)
MAX_TURNS = 12                 # the run's turn cap; every family's own TURNS is below it
AGENT_TURN_TOKENS = 48         # a worked step, "\boxed{...}" and the end-of-turn id
ARMS = ("spade", "static", "solve_rate", "frozen_designer")
SEEDS = (0, 1, 2)
NUM_EXEMPLARS = 1              # memory exemplars per designer prompt (memory.num_exemplars)


def seen() -> tuple[str, ...]:
  """The families the experiment trains on (every family but the held-out one)."""
  return seen_families()


def skills() -> tuple[str, ...]:
  """The skills the seen families cover, in a fixed order."""
  return tuple(sorted(by_skill(seen())))


def max_family_turns() -> int:
  """The largest TURNS any family reaches at any level (must fit ``MAX_TURNS``)."""
  return max(f.max_turns(**f.levels(level)) for f in FAMILIES.values() for level in range(5))


def cache_dir() -> str:
  """Where the tokenizer and the warm-start checkpoint are built ($SPADE_JAX_CACHE)."""
  root = os.environ.get("SPADE_JAX_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "spade_jax")
  return os.path.join(root, "mechanism")


def write_hf(path: str, params, cfg, tokenizer_dir: str = "") -> str:
  """Writes ``params`` as an HF checkpoint in ``path`` (with the tokenizer's files when
  given), atomically: a sibling temporary directory replaces ``path`` once complete."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".hf.", dir=parent)
  models.save_hf(tmp, jax.device_get(params), cfg)
  if tokenizer_dir:
    models.copy_tokenizer_files(tokenizer_dir, tmp)
  swap_in(tmp, path)
  return path


def load_start(path: str, cfg, fix: str):
  """The parameters of the HF checkpoint in ``path`` (an ``--init_from``), checked to have
  ``cfg``'s shapes; a mismatch raises with ``fix`` as the way out."""
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  params, loaded = models.load_hf(path)
  if models.param_shapes(loaded) != models.param_shapes(cfg):
    raise ValueError(f"--init_from={path} holds a different model: its model shape differs "
                     f"from the one asked for ({fix}).")
  return params


def swap_in(tmp: str, dst: str) -> None:
  """Moves the complete directory ``tmp`` to ``dst``, replacing what was there: the old
  copy is renamed aside first, so ``dst`` is never a half-written mix."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  if os.path.isdir(dst):
    old = tempfile.mkdtemp(prefix=".old.", dir=os.path.dirname(os.path.abspath(dst)))
    os.rename(dst, os.path.join(old, "d"))
    os.rename(tmp, dst)
    shutil.rmtree(old)
  else:
    os.rename(tmp, dst)


def runs_dir() -> str:
  """Where the arm runs' workdirs live (``<arm>-<seed>``; not committed, results/ is): in
  the cache beside the warm start, so a fresh checkout on the same machine resumes them."""
  return os.path.join(cache_dir(), "runs")


def warm_start_dir(smoke: bool = False) -> str:
  """The warm-start build directory (``hf/`` holds the checkpoint runs start from)."""
  return os.path.join(cache_dir(), "warm_start_smoke" if smoke else "warm_start")


def weights_digest(hf: str) -> str:
  """SHA-256 of an HF checkpoint's weight files: which warm start a run began from."""
  import hashlib  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  names = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))
  if not names:
    raise FileNotFoundError(f"{hf} holds no *.safetensors weights.")
  for name in names:
    with open(os.path.join(hf, name), "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
  return h.hexdigest()


def warm_start_hf(path: str) -> str:
  """The HF checkpoint a warm start ``path`` names: ``path`` itself when it holds
  ``config.json``, else ``path/hf``; neither raises, naming what was looked for."""
  for d in (path, os.path.join(path, "hf")):
    if os.path.isfile(os.path.join(d, "config.json")):
      return os.path.abspath(d)
  raise FileNotFoundError(
      f"warm start {path!r} holds no HF checkpoint (no config.json in it or in its hf/); "
      "give a warm-start build directory or its hf/, or build one with "
      "`python -m experiments.mechanism.warm_start`.")


__all__ = ["AGENT_TURN_TOKENS", "ARMS", "DESIGNER_PROMPT_TOKENS", "HELD_OUT", "MAX_TURNS",
           "MODEL", "NUM_EXEMPLARS", "RESULTS", "RUN_STORE", "SEEDS", "STORE", "SETTING",
           "SMOKE_MODEL", "VOCAB_SIZE", "cache_dir", "load_start", "max_family_turns",
           "runs_dir", "seen", "skills", "swap_in", "warm_start_dir", "warm_start_hf",
           "weights_digest", "write_hf"]
