r"""What the warm-started agent has learned, per family: its greedy action on the training data.

  python -m experiments.mechanism.diagnose [--rows=24] [--designs=4] [--json=PATH] [--smoke]
      [--out=DIR]

Reads the warm start's cached agent transcripts (``data.pkl``: the scripted player's
episodes) and its checkpoint (``hf/``) and, teacher-forced on each transcript, asks for
every agent turn whether the model's arg-max continuation is the player's whole action
(``\boxed{...}`` and the end of turn). Per seen family it prints that rate, the rate with
the answer inside ``\boxed{}`` ignored (format only), the rate at which the answer alone is
right given everything before it in the turn (for ``--worked`` transcripts: given the
worked step), the rate at which a worked step (text before the box, where the turn has
one) is right, and the nats per trained token. A worked step with an ``=`` is split in two:
its setup (up to and including the last ``=``: the operands copied) and its result (what
follows, given the setup), the result rate also per operator (the first ``+-*/`` with
spaces either side in the setup). A model that has the format but not the decisions
shows a high format rate and a low action rate. Last, a copy probe: random digit strings
followed by themselves; a model that copies in context predicts the repeat. The player
slips on ~10% of turns (``warm_start.P_SLIP``), so 90% is about the best possible action
rate. Then, per family, how near the model is to the designer rows' programs
(``designer_fit``: teacher-forced top-1 rate, misses beyond the knob values, the first
miss).
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import re

from absl import app
from absl import flags

_ROWS = flags.DEFINE_integer("rows", 24, "Transcripts per family.")
_DESIGNS = flags.DEFINE_integer("designs", 4, "Designer rows per family (0: none).")
_JSON = flags.DEFINE_string("json", "", "Also write the figures to this JSON file.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Use the smoke warm start.")
_OUT = flags.DEFINE_string("out", "", "A warm-start build directory (default: the cache's, "
                           "as `warm_start` builds it).")


def turns(mask) -> list[tuple[int, int]]:
  """[start, end) of each run of True in ``mask`` (an agent turn)."""
  out, start = [], None
  for i, m in enumerate(list(mask) + [False]):
    if m and start is None:
      start = i
    elif not m and start is not None:
      out.append((start, i))
      start = None
  return out


def inner(tokens, span, vocab) -> tuple[int, int] | None:
  """[start, end) of the tokens that hold the answer between ``\\boxed{`` and its ``}``
  in one turn (a token that merges the brace with the answer counts as answer), or None."""
  a, b = span
  for i in range(a, b):
    text = vocab.decode(tokens[a:i + 1])
    if "\\boxed{" in text:
      start = i + 1 if text.endswith("\\boxed{") else i
      if "}" in text.split("\\boxed{", 1)[1]:
        return start, i + 1
      for j in range(i + 1, b):
        if "}" in vocab.decode(tokens[i + 1:j + 1]):
          return start, j + 1
      return None
  return None


def equals_split(tokens, lead: int, vocab) -> int | None:
  """The index just past the last token in ``tokens[:lead]`` that holds ``=``, or None."""
  for i in range(lead - 1, -1, -1):
    if "=" in vocab.decode([int(tokens[i])]):
      return i + 1
  return None


def operator(text: str) -> str:
  """The first arithmetic operator standing alone (spaces either side, so a minus sign is
  not one) in a worked step's setup ("?" when none)."""
  m = re.search(r"(?<=\s)[+\-*/](?=\s)", text)
  return m.group(0) if m else "?"


def predictor(out_dir: str):
  """(predict, vocab) of the build's ``hf/``: ``predict(tokens)`` runs one row
  teacher-forced (padded to a power of two, so few shapes compile) and returns the arg-max
  and the log-probabilities at each of its positions, as NumPy arrays."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.models.qwen3 import forward, segment_mask  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  params, cfg = models.load_hf(os.path.join(out_dir, "hf"))

  @jax.jit
  def run(tokens):
    T = tokens.shape[1]
    logits, _ = forward(params, cfg, tokens, jnp.arange(T)[None], segment_mask(
        jnp.ones_like(tokens)))
    return jnp.argmax(logits, -1), jax.nn.log_softmax(logits, -1)

  def predict(tokens):
    t = np.zeros((1, 1 << (len(tokens) - 1).bit_length()), np.int32)
    t[0, :len(tokens)] = tokens
    am, lp = jax.device_get(run(jnp.asarray(t)))
    return am[0, :len(tokens)], lp[0, :len(tokens)]

  return predict, load_tokenizer(os.path.join(out_dir, "hf"))


def sample_by_family(rows, per_family: int, seed: int) -> dict:
  """{family: up to ``per_family`` of its ``rows``, drawn without replacement}, in family
  order, from one seeded stream (so a family's draw depends on those before it)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  by_family = collections.defaultdict(list)
  for r in rows:
    by_family[r.meta["family"]].append(r)
  rng = np.random.default_rng(seed)
  out = {}
  for family in sorted(by_family):
    pool = by_family[family]
    out[family] = [pool[int(k)] for k in rng.choice(len(pool), min(per_family, len(pool)),
                                                    replace=False)]
  return out


def diagnose(out_dir: str, rows_per_family: int, seed: int = 0) -> dict:
  """Per-family action rate, format rate and nats per trained token (see the docstring)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  for name in ("data.pkl", "hf"):
    if not os.path.exists(os.path.join(out_dir, name)):
      raise FileNotFoundError(f"{os.path.join(out_dir, name)} is missing: build the warm start "
                              "first (python -m experiments.mechanism.warm_start).")
  with open(os.path.join(out_dir, "data.pkl"), "rb") as f:
    rows = pickle.load(f)
  predict, vocab = predictor(out_dir)
  agent = [r for r in rows if r.role == data.AGENT and r.meta.get("family") != "copy"]
  out = {}  # copy rows: no turns
  for family, pick in sample_by_family(agent, rows_per_family, seed).items():
    n_turns = action_ok = format_ok = answer_ok = n_worked = work_ok = 0
    n_eq = setup_ok = result_ok = 0
    by_op = collections.defaultdict(lambda: [0, 0])  # operator -> [steps, results right]
    nll, n_tok = 0.0, 0
    for ex in pick:
      pred, lp = predict(ex.tokens)
      for a, b in turns(ex.mask):
        if a == 0:
          continue
        target = np.asarray(ex.tokens[a:b])
        guess = pred[a - 1:b - 1]
        n_turns += 1
        action_ok += int(np.array_equal(guess, target))
        box = inner(ex.tokens, (a, b), vocab)
        keep = np.ones(b - a, bool)
        if box is not None:  # the answer; a "}" token of its own stays format
          end = box[1] - 1 if vocab.decode(ex.tokens[box[1] - 1:box[1]]) == "}" else box[1]
          keep[box[0] - a:end - a] = False
        format_ok += int(np.array_equal(guess[keep], target[keep]))
        answer_ok += int(np.array_equal(guess[~keep], target[~keep]))
        lead = next((i for i in range(b - a) if "\\" in vocab.decode(target[i:i + 1].tolist())),
                    0)
        if lead:  # a worked step precedes the box
          n_worked += 1
          work_ok += int(np.array_equal(guess[:lead], target[:lead]))
          eq = equals_split(target, lead, vocab)
          if eq is not None and eq < lead:
            n_eq += 1
            setup_ok += int(np.array_equal(guess[:eq], target[:eq]))
            right = int(np.array_equal(guess[eq:lead], target[eq:lead]))
            result_ok += right
            op = by_op[operator(vocab.decode(target[:eq].tolist()))]
            op[0] += 1
            op[1] += right
        nll -= float(lp[np.arange(a - 1, b - 1), target].sum())
        n_tok += b - a
    out[family] = {"turns": n_turns, "action_rate": action_ok / max(n_turns, 1),
                   "format_rate": format_ok / max(n_turns, 1),
                   "answer_rate": answer_ok / max(n_turns, 1), "worked_turns": n_worked,
                   "work_rate": work_ok / max(n_worked, 1), "equation_steps": n_eq,
                   "setup_rate": setup_ok / max(n_eq, 1),
                   "result_rate": result_ok / max(n_eq, 1),
                   "result_rate_by_operator": {k: {"steps": n, "rate": ok / n}
                                               for k, (n, ok) in sorted(by_op.items())},
                   "nats_per_token": nll / max(n_tok, 1)}
  return out


def designer_fit(out_dir: str, rows_per_family: int, seed: int = 0) -> dict:
  """Per family, how near the model is to writing the designer rows' programs: teacher-forced
  on ``rows_per_family`` cached designer rows (``data.pkl``), the share of program tokens
  whose arg-max is the program's token, the nats per program token, the mean count of
  missed tokens outside the knob values (``knob_tokens``: drawn at random, so unpredictable),
  the share of rows with none, and the median index of the first missed token (knob values
  included). A model that blends the families of a skill misses from the title on, where
  the program says which one it is."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  with open(os.path.join(out_dir, "data.pkl"), "rb") as f:
    rows = [r for r in pickle.load(f) if r.role == data.DESIGNER]
  if rows_per_family <= 0 or not rows:  # none asked for, or an agent-only build
    return {}
  predict, vocab = predictor(out_dir)
  out = {}
  for family, pick in sample_by_family(rows, rows_per_family, seed).items():
    hits = n_tok = whole = 0
    nll, first, misses = 0.0, [], []
    for ex in pick:
      a = ex.mask.index(True)
      am, lp = predict(ex.tokens)
      target = np.asarray(ex.tokens[a:])
      ok = am[a - 1:len(ex.tokens) - 1] == target
      fixed = ~knob_tokens(target.tolist(), vocab)
      hits += int(ok.sum())
      n_tok += len(target)
      whole += int(ok[fixed].all())
      misses.append(int((~ok[fixed]).sum()))
      first.append(int(np.argmin(ok)) if not ok.all() else len(target))
      nll -= float(lp[np.arange(a - 1, len(ex.tokens) - 1), target].sum())
    out[family] = {"rows": len(pick), "program_tokens": n_tok / max(len(pick), 1),
                   "top1_rate": hits / max(n_tok, 1), "nats_per_token": nll / max(n_tok, 1),
                   "misses_beyond_knobs": float(np.mean(misses)) if misses else 0.0,
                   "whole_rate": whole / max(len(pick), 1),
                   "first_miss_median": float(np.median(first)) if first else 0.0}
  return out


def knob_tokens(tokens, vocab):
  """Which of a program's ``tokens`` hold a knob's value (``NAME = 12`` at a line's start):
  the values a designer row draws at random, so no model predicts them from the prompt."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  pieces = [vocab.decode([t]) for t in tokens]
  text = "".join(pieces)
  spans = [m.span(1) for m in re.finditer(r"^[A-Z][A-Z_0-9]* = (-?\d+)", text, re.M)]
  out, pos = np.zeros(len(tokens), bool), 0
  for i, p in enumerate(pieces):
    out[i] = any(pos < e and s < pos + len(p) for s, e in spans)
    pos += len(p)
  return out


def copy_probe(out_dir: str, rows: int = 8, length: int = 40, seed: int = 0) -> dict:
  """Whether the model copies in context: ``rows`` random digit strings of ``length``
  digits, each followed by itself; the arg-max next-digit accuracy on the first copy
  (chance: ~0.1) and on the repeat (a model that copies: near 1)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.models.qwen3 import forward, segment_mask  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  params, cfg = models.load_hf(os.path.join(out_dir, "hf"))
  vocab = load_tokenizer(os.path.join(out_dir, "hf"))
  digits = np.asarray([vocab.encode(str(d))[-1] for d in range(10)])
  half = digits[np.random.default_rng(seed).integers(0, 10, (rows, length))]
  t = jnp.asarray(np.concatenate([half, half], 1), jnp.int32)
  logits, _ = forward(params, cfg, t, jnp.arange(2 * length)[None],
                      segment_mask(jnp.ones_like(t)))
  hit = np.asarray(jnp.argmax(logits[:, :-1], -1) == t[:, 1:])
  return {"first_top1": float(hit[:, :length - 1].mean()),
          "repeat_top1": float(hit[:, length:].mean())}


def main(argv):
  del argv
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  res = diagnose(_OUT.value or common.warm_start_dir(_SMOKE.value), _ROWS.value)
  print(f"{'family':18s} {'turns':>5s} {'action':>7s} {'format':>7s} {'answer':>7s} "
        f"{'worked':>6s} {'work':>5s} {'nats/tok':>8s}")
  for fam, r in res.items():
    print(f"{fam:18s} {r['turns']:5d} {r['action_rate']:7.2f} {r['format_rate']:7.2f} "
          f"{r['answer_rate']:7.2f} {r['worked_turns']:6d} {r['work_rate']:5.2f} "
          f"{r['nats_per_token']:8.3f}")
  for fam, r in res.items():
    if r["equation_steps"]:
      ops = ", ".join(f"{k} {v['rate']:.2f} ({v['steps']})"
                      for k, v in r["result_rate_by_operator"].items())
      print(f"{fam}: {r['equation_steps']} worked equations, setup right {r['setup_rate']:.2f}, "
            f"result right given it {r['result_rate']:.2f}; by operator: {ops}")
  fit = designer_fit(_OUT.value or common.warm_start_dir(_SMOKE.value), _DESIGNS.value)
  if fit:
    print(f"{'designer rows':18s} {'rows':>5s} {'tokens':>6s} {'top-1':>6s} {'misses':>6s} "
          f"{'none':>5s} {'1st miss':>8s} {'nats/tok':>8s}")
  for fam, r in fit.items():
    print(f"{fam:18s} {r['rows']:5d} {r['program_tokens']:6.0f} {r['top1_rate']:6.3f} "
          f"{r['misses_beyond_knobs']:6.1f} {r['whole_rate']:5.2f} "
          f"{r['first_miss_median']:8.0f} {r['nats_per_token']:8.3f}")
  probe = copy_probe(_OUT.value or common.warm_start_dir(_SMOKE.value))
  print(f"copy probe (next digit, arg-max): first copy {probe['first_top1']:.2f}, repeat "
        f"{probe['repeat_top1']:.2f}")
  if _JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
      json.dump({**res, "designer": fit, "copy_probe": probe}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
