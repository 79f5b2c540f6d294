r"""How fast a model of the experiment's shapes learns in-context copying on this trainer.

  python -m experiments.mechanism.copy_check [--size=smoke|full] [--offset=variable|fixed] \
      [--steps=400] [--alphabet=54] [--learning_rate=3e-3] [--seq_len=512] [--vs_torch] \
      [--json=PATH]

Trains a model from random weights with the warm start's optimizer (AdamW, warm-up then
cosine decay, weight decay 0.1, betas 0.9/0.98, clipping at 1) on rows made of a random
sequence of ``--alphabet`` ids, a separator and the same sequence again; only the repeat is
trained. With ``--offset=fixed`` every sequence has the same length, so the token to copy
always sits the same distance back and one positional attention head solves the task; with
``variable`` (16-120 ids, packed several to a row) only an induction circuit does (find the
earlier occurrence of the current token, copy what followed it), which is what the agent
needs to read numbers out of an observation. Every ``--every`` steps it prints the loss and
the arg-max accuracy on the repeats of held-out rows; ``--json`` writes that curve.

``--vs_torch`` (with ``--offset=fixed``) also trains the same model in PyTorch
(``transformers``' Qwen3 from this model's exported starting weights, ``torch.optim.AdamW`` with
the same decay mask, clipping and schedule) on the same rows, each packed segment its own
PyTorch row, and prints both losses: a check of the whole training path against another
trainer over many steps.

``--size``: ``smoke`` is the smoke warm start's shape (2 layers, width 64; vocabulary
``alphabet + 10``), ``full`` the experiment's (8 layers, width 320, 6,144 ids).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

SEP, END, FIRST_ID = 2, 1, 10
MIN_LEN, MAX_LEN = 16, 120
BATCH = 8


def examples(n: int, seed: int, alphabet: int, fixed_len: int | None,
             lengths: tuple[int, int] = (MIN_LEN, MAX_LEN), ids=None):
  """``n`` copy rows as warm-start ``Example``s (the repeat and its end id trained); a
  sequence has ``fixed_len`` ids, or a number in ``lengths`` (inclusive), drawn from
  ``ids`` (a sequence of token ids) or else from ``FIRST_ID .. FIRST_ID + alphabet - 1``."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  pool = None if ids is None else np.asarray(ids)
  out = []
  for _ in range(n):
    k = fixed_len or int(rng.integers(lengths[0], lengths[1] + 1))
    if pool is None:
      seq = [int(i) for i in rng.integers(FIRST_ID, FIRST_ID + alphabet, k)]
    else:
      seq = [int(i) for i in rng.choice(pool, k)]
    out.append(data.Example(seq + [SEP] + seq + [END], [False] * (k + 1) + [True] * (k + 1),
                            data.AGENT, {"family": "copy"}))
  return out


def run(*, size: str, offset: str, steps: int, alphabet: int, learning_rate: float,
        seq_len: int, fixed_len: int, every: int, vs_torch: bool = False,
        qk_scale: float = 1.0, save: str = "", lengths: tuple[int, int] = (MIN_LEN, MAX_LEN),
        vocab_size: int | None = None, num_layers: int | None = None,
        shape: dict | None = None, ids=None, init_from: str = "",
        log=print) -> list[dict]:
  """Trains and returns the curve: ``{"step", "loss", "repeat_top1", "seconds"}`` rows
  (and ``"torch_loss"``, the PyTorch model's loss on the same batch, with ``vs_torch``).

  ``vocab_size``: the model's vocabulary (default: ``alphabet + 10`` for ``smoke``, the
  experiment's 6,144 for ``full``).
  ``num_layers``: the model's depth (default: the shape's).
  ``shape``: other ``ModelConfig`` fields over the ``size``'s (e.g. ``{"d_model": 320}``),
  to tell apart what of the two shapes decides how fast copying forms.
  ``lengths``: the shortest and longest sequence with ``offset="variable"``.
  ``ids``: the token ids sequences draw from (in place of ``alphabet``), e.g. those a
  tokenizer gives the data that training continues on.
  ``init_from``: an HF directory whose weights start training (a fresh optimizer and
  schedule), e.g. an earlier run's ``save``; its shape must be the one asked for.
  ``save``: a directory that receives the trained weights as an HF checkpoint (what
  ``warm_start --init_from`` reads), written once training ends.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spade_jax import models, parallel  # pylint: disable=g-import-not-at-top
  from spade_jax.models.qwen3 import segment_mask  # pylint: disable=g-import-not-at-top
  from spade_jax.rl import (LossConfig, OptimizerConfig, TrainConfig,  # pylint: disable=g-import-not-at-top
                            Trainer)
  from experiments.mechanism import common, data  # pylint: disable=g-import-not-at-top
  fixed = fixed_len if offset == "fixed" else None
  if fixed is not None and 2 * fixed + 2 > seq_len:
    raise ValueError(f"--fixed_len={fixed_len} needs rows of {2 * fixed_len + 2} tokens; "
                     f"raise --seq_len (now {seq_len}).")
  if fixed is not None and seq_len % (2 * fixed + 2):
    raise ValueError(f"--offset=fixed packs whole rows of {2 * fixed + 2} tokens: make "
                     f"--seq_len (now {seq_len}) a multiple of it.")
  if vs_torch and fixed is None:
    raise ValueError("--vs_torch compares equal-length rows: pass --offset=fixed.")
  if not qk_scale > 0:
    raise ValueError(f"--qk_scale={qk_scale}: the norm scale must be positive.")
  if vs_torch and qk_scale != 1.0:
    raise ValueError("--vs_torch starts both models from the same weights: leave --qk_scale=1.")
  if offset == "variable" and not 1 <= lengths[0] <= lengths[1]:
    raise ValueError(f"--min_len={lengths[0]} and --max_len={lengths[1]}: need "
                     "1 <= min_len <= max_len.")
  if offset == "variable" and 2 * lengths[1] + 2 > seq_len:
    raise ValueError(f"--offset=variable with --max_len={lengths[1]} needs --seq_len >= "
                     f"{2 * lengths[1] + 2}.")
  base = common.SMOKE_MODEL if size == "smoke" else common.MODEL
  unknown = sorted(set(shape or {}) - set(base) - {"vocab_size", "num_layers"})
  if unknown or "vocab_size" in (shape or {}) or "num_layers" in (shape or {}):
    raise ValueError(f"--shape: {unknown or 'vocab_size/num_layers'} cannot be set there; "
                     f"it takes {sorted(set(base) - {'vocab_size', 'num_layers'})} "
                     "(--vocab_size and --num_layers have their own flags).")
  if ids is not None:
    ids = sorted({int(i) for i in ids})
    if len(ids) < 2 or ids[0] < FIRST_ID:
      raise ValueError(f"ids: need at least two ids, all >= {FIRST_ID} (ids below are the "
                       "separator and end markers); got "
                       f"{len(ids)} from {ids[0] if ids else None}.")
    alphabet = ids[-1] + 1 - FIRST_ID  # the vocabulary must hold the largest
  vocab = vocab_size or (FIRST_ID + alphabet if size == "smoke" else base["vocab_size"])
  if FIRST_ID + alphabet > vocab:
    raise ValueError(f"--alphabet={alphabet} does not fit the {vocab}-id vocabulary.")
  if num_layers is not None and num_layers < 1:
    raise ValueError(f"--num_layers={num_layers}: need at least one layer.")
  cfg = models.ModelConfig(**dict(base, **(shape or {}), vocab_size=vocab,
                                  num_layers=num_layers or base["num_layers"]))
  mesh_cfg = parallel.MeshConfig()
  opt_cfg = OptimizerConfig(learning_rate=learning_rate, schedule="cosine",
                            warmup_steps=min(20, steps // 10), total_steps=steps,
                            weight_decay=0.1, b1=0.9, b2=0.98)
  trainer = Trainer(cfg, TrainConfig(BATCH, seq_len, 1, objective="sft"),
                    LossConfig(kl_coef=0.0, aggregation="token_mean"), opt_cfg,
                    parallel.make_mesh(mesh_cfg, jax.devices()),
                    parallel.RULE_SETS[mesh_cfg.rules])
  state = trainer.init_state(jax.random.key(0))
  if init_from:
    state = trainer.state_from_params(common.load_start(
        init_from, cfg, "match --size, --vocab_size, --num_layers and --shape to it"))
  if qk_scale != 1.0:
    if not cfg.qk_norm:
      raise ValueError(f"--qk_scale={qk_scale} scales the q/k RMSNorm weights, which a "
                       "model with qk_norm=False has not; drop --qk_scale.")
    layers = dict(state.params["layers"])
    for name in ("q_norm", "k_norm"):
      layers[name] = layers[name] * qk_scale
    state = trainer.state_from_params(dict(state.params, layers=layers))
  if fixed is None:
    per_row = max(4, seq_len // (sum(lengths) + 2))  # ~one pass over the examples
    batches = data.pack(examples(max(1000, steps * BATCH * per_row), 0, alphabet, None,
                                 lengths, ids), BATCH, seq_len, seed=0)
  else:  # fresh rows of seq_len // (2 * fixed + 2) whole segments each step
    per_row = seq_len // (2 * fixed + 2)
    batches = (next(data.pack(examples(BATCH * per_row, 1000 + i, alphabet, fixed, ids=ids),
                              BATCH, seq_len, seed=i)) for i in range(steps))
  held = {k: jnp.asarray(v) for k, v in next(data.pack(
      examples(200, 1, alphabet, fixed, lengths, ids), BATCH, seq_len, seed=1)).items()}
  torch_step = _torch_trainer(state.params, cfg, opt_cfg) if vs_torch else None

  @jax.jit
  def repeat_top1(params, b):
    logits, _ = models.forward(params, cfg, b["tokens"], b["positions"],
                               segment_mask(b["segment_ids"]))
    hit = jnp.argmax(logits[:, :-1], -1) == b["tokens"][:, 1:]
    trained = b["loss_mask"][:, 1:] & (b["segment_ids"][:, 1:] == b["segment_ids"][:, :-1])
    return jnp.sum(hit & trained) / jnp.sum(trained)

  curve, t0 = [], time.time()
  for step in range(steps):
    batch = next(batches)
    state, metrics = trainer.step(state, batch)
    theirs = torch_step(batch, step, 2 * fixed + 2) if torch_step else None
    if (step + 1) % every == 0 or step + 1 == steps:
      row = {"step": step + 1, "loss": float(metrics["loss"]),
             "repeat_top1": float(repeat_top1(state.params, held)),
             "seconds": round(time.time() - t0, 1)}
      vs = ""
      if theirs is not None:
        row["torch_loss"] = theirs
        vs = f" (PyTorch {theirs:.4f}, ours {row['loss']:.4f})"
      curve.append(row)
      log(f"{size} {offset} step {row['step']}/{steps}: loss {row['loss']:.3f}{vs}, repeat "
          f"arg-max accuracy {row['repeat_top1']:.3f} ({row['seconds']:.0f} s)")
  if save:
    common.write_hf(save, state.params, cfg)
    log(f"wrote the trained weights to {save}")
  return curve


def _torch_trainer(params, cfg, opt_cfg):
  """``step(batch, i, segment_len) -> loss``: the same model and AdamW in PyTorch."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.rl import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  d = tempfile.mkdtemp(prefix="copy_check.")
  models.save_hf(d, jax.device_get(params), cfg)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      d, torch_dtype=torch.float32, attn_implementation="eager")
  shutil.rmtree(d)
  model.train()
  named = list(model.named_parameters())
  opt = torch.optim.AdamW(  # decay off the norm scales, as `optimizer.decay_mask`
      [{"params": [p for n, p in named if "norm" not in n], "weight_decay": opt_cfg.weight_decay},
       {"params": [p for n, p in named if "norm" in n], "weight_decay": 0.0}],
      lr=opt_cfg.learning_rate, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps)
  schedule = opt_lib.SCHEDULES[opt_cfg.schedule](opt_cfg)

  def step(batch, i, segment_len):
    for group in opt.param_groups:
      group["lr"] = float(schedule(i))
    x = torch.from_numpy(batch["tokens"].reshape(-1, segment_len)).long()
    mask = torch.from_numpy(batch["loss_mask"].reshape(-1, segment_len)[:, 1:]).float()
    logp = torch.log_softmax(model(input_ids=x).logits.float()[:, :-1], -1)
    loss = -(logp.gather(-1, x[:, 1:, None])[..., 0] * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    if opt_cfg.grad_clip:
      torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.grad_clip)
    opt.step()
    return float(loss.detach())
  return step


def _define_flags() -> None:
  """Flags exist only when this file runs as a command (other mechanism commands share
  names such as ``--json``)."""
  flags.DEFINE_enum("size", "smoke", ["smoke", "full"], "Model shape.")
  flags.DEFINE_enum("offset", "variable", ["variable", "fixed"],
                    "Sequence lengths: 16-120 ids, or all --fixed_len.")
  flags.DEFINE_integer("steps", 400, "Optimizer steps (8 rows each).")
  flags.DEFINE_integer("alphabet", 54, "Distinct ids a sequence draws from.")
  flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
  flags.DEFINE_integer("seq_len", 512, "Tokens per packed row.")
  flags.DEFINE_integer("num_layers", 0, "Layers of the model (0: the --size shape's).")
  flags.DEFINE_integer("vocab_size", 0, "Vocabulary of the model (0: the --size shape's).")
  flags.DEFINE_string("shape", "", "Other model fields over the --size shape's, e.g. "
                      "'d_model=320,num_heads=2,head_dim=32'.")
  flags.DEFINE_integer("min_len", MIN_LEN, "Shortest sequence with --offset=variable.")
  flags.DEFINE_integer("max_len", MAX_LEN, "Longest sequence with --offset=variable.")
  flags.DEFINE_integer("fixed_len", 127, "Sequence length with --offset=fixed.")
  flags.DEFINE_bool("vs_torch", False, "Also train the same model in PyTorch on the same "
                    "rows and print both losses (--offset=fixed).")
  flags.DEFINE_float("qk_scale", 1.0, "Initial scale of the query and key RMSNorms (1 as "
                    "Qwen3 initialises them; the largest attention logit is qk_scale**2 * "
                    "sqrt(head_dim)).")
  flags.DEFINE_integer("every", 25, "Steps between evaluations.")
  flags.DEFINE_string("json", "", "Also write the curve to this JSON file.")
  flags.DEFINE_string("init_from", "", "Start from the weights in this HF directory (e.g. "
                      "an earlier --save) with a fresh optimizer.")
  flags.DEFINE_string("save", "", "Write the trained weights here as an HF checkpoint (a "
                      "starting point for `warm_start --init_from`).")


def parse_shape(text: str) -> dict:
  """``"d_model=320,num_heads=2"`` -> ``{"d_model": 320, "num_heads": 2}``."""
  out = {}
  for item in filter(None, (t.strip() for t in text.split(","))):
    key, _, value = item.partition("=")
    try:  # "d_model" alone has no value: int("") raises too
      out[key.strip()] = int(value)
    except ValueError:
      raise ValueError(f"--shape item {item!r}: write key=integer, e.g. d_model=320.") from None
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  kw = dict(size=f.size, offset=f.offset, steps=f.steps, alphabet=f.alphabet,
            learning_rate=f.learning_rate, seq_len=f.seq_len, fixed_len=f.fixed_len,
            every=f.every, vs_torch=f.vs_torch, qk_scale=f.qk_scale, save=f.save,
            lengths=(f.min_len, f.max_len), num_layers=f.num_layers or None,
            vocab_size=f.vocab_size or None, shape=parse_shape(f.shape),
            init_from=f.init_from)
  curve = run(**kw)
  if f.json:
    os.makedirs(os.path.dirname(os.path.abspath(f.json)), exist_ok=True)
    with open(f.json, "w") as out:
      json.dump({"settings": kw, "curve": curve}, out, indent=1)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
