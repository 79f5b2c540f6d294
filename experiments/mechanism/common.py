"""What every part of the mechanism experiment shares: arms, seeds, families, paths."""

from __future__ import annotations

import hashlib
import math
import os
import re
import zlib

import numpy as np

from experiments.configs import common as recipes
from spade_jax.models.tensorfile import CheckpointReader
from spade_jax.envs.families import FAMILIES, HELD_OUT, by_skill, seen_families

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
LEARNER = os.path.join(HERE, "LEARNER.md")  # the learner investigation: the tagged variants

BASE = "gguf:smollm2_135m_instruct"  # the pretrained model every arm starts from, via SFT
ARMS = ("spade", "static", "solve_rate", "frozen_designer")
SEEDS = (0, 1, 2)
SETTING = "games"
MAX_TURNS = 12                 # the run's turn cap; every family's own TURNS is below it
AGENT_TURN_TOKENS = 48         # a worked step, "\boxed{...}" and the end-of-turn id
DESIGNER_PROMPT_TOKENS = 2048  # the designer prompt (one exemplar program fits)
# What the designer may write, by program form: the longest library program is ~190
# SmolLM2 tokens, the longest full family program 1,448.
DESIGNER_NEW_TOKENS = {"library": 256, "full": 1536}
# Where the designers start and what the evaluation calls their level: the level at which
# the warm start is in its learning band. SmolLM2-135M after the SFT won the seen families
# 0.39 of the time at level 0, 0.11 at level 1 and 0.02 at level 2 (measured on its SFT
# checkpoints 16 and 24, README), so the designer's SFT programs draw each knob from
# levels DESIGNER_KNOB_LEVELS (mostly 0) rather than from all five.
DESIGNER_LEVEL = 0
DESIGNER_KNOB_LEVELS = (0, 0, 1)
HARDER_LEVEL = 2               # the seen families' transfer level
HELD_OUT_LEVELS = (0, 1, 2)    # the held-out family's 5-30% band lay between 1 and 2


def seen() -> tuple[str, ...]:
  """The families the experiment trains on (every family but the held-out one)."""
  return seen_families()


def skills() -> tuple[str, ...]:
  """The skills the seen families cover, in a fixed order."""
  return tuple(sorted(by_skill(seen())))


def cache_dir() -> str:
  """The experiment's cache: warm start, SFT rows, run directories."""
  return os.path.join(recipes.cache_dir(), "mechanism")


def warm_start_dir(smoke: bool = False) -> str:
  """The warm start's build directory (``hf/`` is what the arms start from)."""
  return os.path.join(cache_dir(), "warm_start_smoke" if smoke else "warm_start")


def runs_dir() -> str:
  """Where the arm runs live, ``<arm>-<seed>``."""
  return os.path.join(cache_dir(), "runs")


# Two builds of the warm start from the same rows and keys on different CPUs round float32
# reductions differently: their 32 SFT losses agreed to 1e-6 and their SHA-256s differed.
# A fingerprint tells such builds (the same model) from different ones: per tensor its
# mean and a fixed random-sign projection in units of its RMS, and its RMS, compared within
# FINGERPRINT_TOL (rounding moves each by ~1e-6; one more SFT step at lr 1e-4 by ~1e-3).
FINGERPRINT_TOL = 1e-4


def weights_fingerprint(hf: str) -> dict[str, list[float]]:
  """Per tensor of an HF checkpoint: [mean / rms, rms, sum(w * signs) / (rms * sqrt(n))],
  ``signs`` a fixed pseudo-random +-1 vector seeded by the tensor's name."""
  reader = CheckpointReader(hf)
  out = {}
  for name in sorted(reader.keys()):
    w = np.asarray(reader.get(name), np.float64).ravel()
    rms = float(np.sqrt(np.mean(w * w))) or 1.0
    signs = np.random.default_rng(zlib.crc32(name.encode())).integers(0, 2, w.size) * 2 - 1
    out[name] = [float(w.mean()) / rms, rms, float(w @ signs) / (rms * math.sqrt(w.size))]
  return out


def same_weights(a: dict | None, b: dict | None, tol: float = FINGERPRINT_TOL) -> bool:
  """Whether two `weights_fingerprint`s are of the same model (False when either is
  missing: a record from before fingerprints is matched by its SHA-256 alone)."""
  if not a or not b or a.keys() != b.keys():
    return False
  return all(abs(a[k][0] - b[k][0]) <= tol and abs(a[k][2] - b[k][2]) <= tol and
             abs(a[k][1] - b[k][1]) <= tol * max(a[k][1], b[k][1]) for k in a)


def weights_digest(hf: str) -> str:
  """SHA-256 over an HF checkpoint's ``*.safetensors`` files (sorted by name)."""
  names = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))
  if not names:
    raise FileNotFoundError(f"{hf} holds no *.safetensors weights.")
  h = hashlib.sha256()
  for name in names:
    with open(os.path.join(hf, name), "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
  return h.hexdigest()


def family_of(source: str) -> tuple[str | None, float | None]:
  """(family, mean difficulty level of its knobs) of a program written from a family: the
  family whose title opens it, else the family a library program imports (`from families
  import <name>`, its title reworded); each knob's level the one closest to the value it
  sets."""
  fam = next((f for f in FAMILIES.values()
              if source.lstrip().startswith(f'"""{f.title}"""')), None)
  if fam is None:
    m = re.search(r"^from families import (\w+)", source, re.M)
    fam = FAMILIES.get(m.group(1)) if m else None
  if fam is None:
    return None, None
  levels = []
  for k in fam.knobs:
    m = re.search(rf"^{k.name} = (-?\d+)", source, re.M)
    if m:
      v = int(m.group(1))
      levels.append(min(range(len(k.levels)), key=lambda i: (abs(k.levels[i] - v), i)))
  return fam.name, (sum(levels) / len(levels) if levels else None)


__all__ = ["AGENT_TURN_TOKENS", "ARMS", "BASE", "DESIGNER_KNOB_LEVELS", "DESIGNER_LEVEL",
           "DESIGNER_NEW_TOKENS", "DESIGNER_PROMPT_TOKENS", "FINGERPRINT_TOL", "HARDER_LEVEL",
           "HELD_OUT", "HELD_OUT_LEVELS", "LEARNER", "MAX_TURNS", "README",
           "RESULTS", "SEEDS", "SETTING", "cache_dir", "family_of", "runs_dir", "seen",
           "same_weights", "skills", "warm_start_dir", "weights_digest",
           "weights_fingerprint"]
