r"""Builds (or resumes) the warm-start checkpoint every arm of the experiment starts from.

  python -m experiments.mechanism.warm_start [--smoke]                  # the staged recipe
  python -m experiments.mechanism.warm_start --recipe=single [--steps=N ...]
  python -m experiments.mechanism.warm_start --out=DIR --snapshot   # a look midway
  python -m experiments.mechanism.warm_start --out=DIR --publish    # store it as far as it went

One command, cached under ``$SPADE_JAX_CACHE/mechanism/warm_start[_smoke]/``. The default
(``--recipe=staged``) runs the builds of ``STAGES`` in ``stages/<i>_<name>/``, each from the
last one's weights and tokenizer, and takes the last one's ``hf/`` and ``levels.json``;
``--recipe=single`` runs one build from the flags. Each finished stage is also stored in
``experiments/mechanism/stages/<i>_<name>/`` (``--store``; weights, tokenizer, records and
a ``stage.json`` with the stage's arguments, step and weights' SHA-256), which is
committed; ``--publish`` stores a build as far as it went (the stage under way as its
latest checkpoint's weights). A build on another checkout takes the stored stages and goes
on from where they end, so the recipe of 13 h or more runs across sittings. A build does
this:

1. ``tokenizer/``: a 6,144-id byte-level BPE with Qwen3's pre-tokenizer split (one token per
   digit) trained offline (``tokenizers``) on the texts the experiment reads and writes:
   designer prompts, family programs, agent transcripts.
2. ``data.pkl``: the supervised rows (``data.py``): designer prompt -> family program at
   random knob values, and agent transcripts of a noisy scripted player, hinted or not.
3. ``train/``: next-token training of a Qwen3-shaped ~10.5M-parameter model with the library's
   own trainer (``train.objective="sft"``: same model code, train state, sharded step),
   AdamW with warm-up and cosine decay; checkpointed every ``--checkpoint_every`` steps and
   resumed from the last one, so an interrupted build loses at most that many steps.
4. ``hf/``: the final weights in Hugging Face format with the tokenizer (what the arms load
   with ``model.init_from=hf:DIR``), written atomically.
5. ``levels.json``: the starting levels, measured as the runs play (``measure.py``): the
   agent's win rate on medium-difficulty episodes of the seen families, and the designer's
   valid-program rate.

With ``--induction_steps=N`` a stage 0 comes first: ``induction/``, the same model trained N
steps on short copy rows (``copy_check.py``: 4-24 ids drawn from the ids the supervised rows
contain, so it trains the embeddings the next stage reads; only the repeat trained; peak
``--induction_lr``, 1e-3: at width 320 a peak of 3e-3 or more keeps the model off copying),
on which the experiment's 8-layer model reaches ~0.5 repeat accuracy in 300 steps (see the
mechanism README); stage 3 then starts from those weights (as ``--init_from`` would).

Each stage is skipped when its output exists (``--force`` rebuilds from the data on).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags


# The scripted player's slip probabilities and the level mix of its episodes.
P_SLIP, P_SLIP_HINTED, HINTED_FRAC = 0.15, 0.05, 0.5
AGENT_LEVELS = (0, 1, 1, 2, 2, 2, 3, 3, 4)


def _log(msg: str) -> None:
  print(f"[warm start {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_tokenizer(out: str, vocab_size: int, worked: bool = False) -> str:
  """Trains the experiment's BPE vocabulary into ``out/tokenizer`` (once)."""
  from spade_jax import designer as dz  # pylint: disable=g-import-not-at-top
  from spade_jax.models import ChatTemplate, ByteVocab  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import train_bpe  # pylint: disable=g-import-not-at-top
  from spade_jax import sandbox  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import common, data  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, "tokenizer")
  if os.path.isfile(os.path.join(path, "tokenizer.json")):
    return path
  _log("training the BPE tokenizer")
  chat = ChatTemplate(ByteVocab(), thinking=False)
  texts = []
  corpus = data.corpus(out, seed=99)
  for ex in data.designer_examples(chat, corpus, 60, seed=99, families=common.seen(),
                                   budget=None):
    texts.append(chat.vocab.decode(ex.tokens))
  with sandbox.EnvPool(sandbox.SandboxConfig()) as pool:
    for ex in data.agent_examples(pool, chat, 120, seed=99, families=common.seen(),
                                  levels=range(5), p=P_SLIP, p_hinted=P_SLIP_HINTED,
                                  hinted_frac=HINTED_FRAC, max_turns=common.MAX_TURNS,
                                  worked=worked):
      texts.append(chat.vocab.decode(ex.tokens))
  texts.append(dz.agent_system_prompt(common.SETTING))
  tmp = tempfile.mkdtemp(prefix=".tokenizer.", dir=out)
  train_bpe(texts, vocab_size, tmp)
  os.rename(tmp, path)
  return path


def build_data(out: str, chat, *, designer_rows: int, agent_rows: int,
               worked: bool = False, copy_rows: int = 0, families=(),
               designer_balance: str = "skill") -> list:
  """The supervised rows (cached in ``out/data.pkl``); ``families``: the seen families the
  agent transcripts play (all of them when empty); ``designer_balance``: how the designer
  rows share out over the seen families (``data.designer_examples``'s ``balance``)."""
  from spade_jax import sandbox  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import common, data  # pylint: disable=g-import-not-at-top
  families = tuple(families) or common.seen()
  path = os.path.join(out, "data.pkl")
  if os.path.isfile(path):
    stats = os.path.join(out, "data_stats.json")
    cached = json.load(open(stats)) if os.path.isfile(stats) else {}
    want = sorted(families)
    if cached.get("families") is not None and cached["families"] != want:
      raise ValueError(f"{path} holds transcripts of {cached['families']}, not of {want}; use "
                       f"another --out, or --force to rebuild the data")
    if cached and cached.get("designer_balance", "skill") != designer_balance:
      raise ValueError(f"{path} holds designer rows balanced by "
                       f"{cached.get('designer_balance', 'skill')}, not by {designer_balance}; "
                       f"use another --out, or --force to rebuild the data")
    with open(path, "rb") as f:
      return pickle.load(f)
  t0 = time.time()
  _log(f"writing {designer_rows} designer rows")
  rows = data.designer_examples(chat, data.corpus(out, seed=0), designer_rows, seed=0,
                                families=common.seen(), budget=common.DESIGNER_PROMPT_TOKENS,
                                num_exemplars=common.NUM_EXEMPLARS,
                                balance=designer_balance)
  _log(f"playing {agent_rows} scripted agent episodes in the sandbox")
  with sandbox.EnvPool(sandbox.SandboxConfig()) as pool:
    for start in range(0, agent_rows, 1000):
      rows += data.agent_examples(pool, chat, min(1000, agent_rows - start), seed=start,
                                  families=families, levels=AGENT_LEVELS, p=P_SLIP,
                                  p_hinted=P_SLIP_HINTED, hinted_frac=HINTED_FRAC,
                                  max_turns=common.MAX_TURNS, worked=worked)
      _log(f"  {min(agent_rows, start + 1000)}/{agent_rows} episodes")
  agent = [r for r in rows if r.role == data.AGENT]
  if copy_rows:
    _log(f"writing {copy_rows} copy rows")
    rows += data.copy_examples(chat.vocab, copy_rows, seed=0)
  stats = {"designer_rows": designer_rows, "designer_balance": designer_balance,
           "agent_rows": len(agent), "worked": worked,
           "families": sorted(families),
           "copy_rows": copy_rows,
           "scripted_win_rate": (sum(r.meta.get("solved", False) for r in agent)
                                 / max(1, len(agent))),
           "tokens": sum(len(r.tokens) for r in rows),
           "trained_tokens": sum(sum(r.mask) for r in rows),
           "longest": max(len(r.tokens) for r in rows), "seconds": time.time() - t0}
  _log(f"data: {json.dumps(stats)}")
  with open(os.path.join(out, "data_stats.json"), "w") as f:
    json.dump(stats, f, indent=1)
  with open(path + ".tmp", "wb") as f:
    pickle.dump(rows, f)
  os.replace(path + ".tmp", path)
  return rows


def train(out: str, model_cfg, rows, *, steps: int, batch_size: int, seq_len: int,
          learning_rate: float, checkpoint_every: int, micro: int = 1, remat: str = "full",
          init_from: str = ""):
  """SFT with checkpoints under ``out/train``; returns the final params.

  ``init_from``: an HF directory whose weights start a build that has no checkpoint yet
  (a fresh optimizer and schedule); ignored once the build has a checkpoint.
  A build with no checkpoint of its own and an ``out/resume.json`` (a stored unfinished
  stage, :func:`seed_stage`) goes on from the weights and step it names.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  trainer = _trainer(model_cfg, steps=steps, batch_size=batch_size, seq_len=seq_len,
                     learning_rate=learning_rate, micro=micro, remat=remat)
  ckpt = checkpoint.Checkpointer(os.path.join(out, "train"), keep=2)
  resume = _read_json(os.path.join(out, RESUME))
  batches = data.pack(rows, batch_size, seq_len, seed=0)
  start = 0
  if ckpt.latest_step() is not None:
    state, _, host = ckpt.restore(trainer.init_state(jax.random.key(0)),
                                  {"step": np.zeros((), np.int32)})
    start = int(host["step"])
    _log(f"resumed at step {start}")
  elif resume:
    from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
    start = int(resume["step"])
    fresh = trainer.state_from_params(common.load_start(
        resume["hf"], model_cfg, "the stored stage is of another experiment size"))
    state = fresh.replace(step=jax.numpy.full_like(fresh.step, start), opt_state=load_opt_state(
        resume["opt_state"], fresh.opt_state))
    _log(f"went on at step {start} from the stored weights and optimizer state in "
         f"{os.path.dirname(resume['hf'])}")
  elif init_from:
    from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
    state = trainer.state_from_params(common.load_start(
        init_from, model_cfg, "use a checkpoint of the same experiment size"))
    _log(f"started from the weights in {init_from}")
  else:
    state = trainer.init_state(jax.random.key(0))
  for _ in range(start):  # the same batch order as an uninterrupted build
    next(batches)
  log = open(os.path.join(out, "train_log.jsonl"), "a")
  t0, tokens = time.time(), 0
  for step in range(start, steps):
    batch = next(batches)
    state, m = trainer.step(state, batch)
    tokens += int(batch["loss_mask"].sum())
    if (step + 1) % 10 == 0 or step + 1 == steps:
      m = {k: float(v) for k, v in jax.device_get(m).items() if getattr(v, "ndim", 1) == 0}
      rate = tokens / (time.time() - t0)
      _log(f"step {step + 1}/{steps} loss {m.get('loss', float('nan')):.4f} "
           f"({rate:.0f} trained tokens/s)")
      log.write(json.dumps({"step": step + 1, **m}) + "\n")
      log.flush()
    if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
      ckpt.save(step + 1, state, {"step": np.asarray(step + 1, np.int32)},
                {"step": step + 1})
  log.close()
  ckpt.close()
  return state.params


RESUME = "resume.json"  # in a build directory: the stored weights and step it goes on from
OPT_STATE = "opt_state.npz"  # a stored unfinished stage's optimizer state


def save_opt_state(path: str, opt_state) -> None:
  """Writes an optimizer state's leaves to ``path`` (``.npz``, no pickles): floating-point
  leaves (AdamW's moments) in bfloat16, half their size, others (step counts) as they are."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  arrays = {}
  for i, leaf in enumerate(jax.tree.leaves(jax.device_get(opt_state))):
    leaf = np.asarray(leaf)
    if np.issubdtype(leaf.dtype, np.floating):
      arrays[f"bf16_{i}"] = leaf.astype(ml_dtypes.bfloat16).view(np.uint16)
    else:
      arrays[f"raw_{i}"] = leaf
  with open(path + ".tmp", "wb") as f:
    np.savez(f, **arrays)
  os.replace(path + ".tmp", path)


def load_opt_state(path: str, like):
  """The optimizer state in ``path`` (:func:`save_opt_state`) in the structure, dtypes and
  shardings of ``like``; a file of another structure or shape raises."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  leaves, treedef = jax.tree.flatten(like)
  with np.load(path, allow_pickle=False) as z:
    stored = {k: z[k] for k in z.files}
  if len(stored) != len(leaves):
    raise ValueError(f"{path} holds {len(stored)} optimizer-state arrays, this optimizer "
                     f"{len(leaves)}: it was stored by another optimizer or model.")
  out = []
  for i, leaf in enumerate(leaves):
    a = (stored[f"bf16_{i}"].view(ml_dtypes.bfloat16) if f"bf16_{i}" in stored
         else stored.get(f"raw_{i}"))
    if a is None or a.shape != leaf.shape:
      raise ValueError(f"{path}: optimizer-state array {i} is missing or has shape "
                       f"{None if a is None else a.shape}, expected {leaf.shape}.")
    out.append(jax.device_put(a.astype(leaf.dtype), leaf.sharding))
  return jax.tree.unflatten(treedef, out)


def _restore(out: str, smoke: bool, step: int | None):
  """A build's checkpointed train state (the latest, or ``step``), the step and the model
  config."""
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import checkpoint, models  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  ckpt = checkpoint.Checkpointer(os.path.join(out, "train"), keep=2)
  if step is None:
    step = ckpt.latest_step()
    if step is None:
      raise FileNotFoundError(f"{os.path.join(out, 'train')} holds no checkpoint to export; "
                              "a build writes one every --checkpoint_every steps.")
  cfg = models.get_preset("tiny", **(common.SMOKE_MODEL if smoke else common.MODEL))
  trainer = _trainer(cfg, steps=1, batch_size=8, seq_len=128, learning_rate=1e-3, micro=1,
                     remat="none")
  state = ckpt.restore_state(trainer.init_state(jax.random.key(0)), step=step)
  ckpt.close()
  return state, step, cfg


def _trainer(model_cfg, *, steps: int, batch_size: int, seq_len: int, learning_rate: float,
             micro: int, remat: str):
  """The build's SFT trainer: AdamW, warm-up then cosine decay over ``steps``."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import parallel  # pylint: disable=g-import-not-at-top
  from spade_jax.rl import (LossConfig, OptimizerConfig, TrainConfig,  # pylint: disable=g-import-not-at-top
                            Trainer)
  mesh_cfg = parallel.MeshConfig()
  mesh = parallel.make_mesh(mesh_cfg, jax.devices())
  # Rematerialised layers and micro-batches bound the activations ([T, T] scores per head).
  return Trainer(dataclasses.replace(model_cfg, remat=remat),
                 TrainConfig(batch_size, seq_len, micro, objective="sft"),
                 LossConfig(kl_coef=0.0, aggregation="token_mean"),
                 OptimizerConfig(learning_rate=learning_rate, schedule="cosine",
                                 warmup_steps=min(100, steps // 10), total_steps=steps,
                                 weight_decay=0.1, b1=0.9, b2=0.98),
                 mesh, parallel.RULE_SETS[mesh_cfg.rules])


def snapshot(out: str, *, smoke: bool = False, step: int | None = None) -> str:
  """Exports a build's checkpoint (the latest, or ``step``) to ``out/hf_<step>`` with its
  tokenizer, without training and without touching the build, which may still be running:
  a look at a long build midway (``measure.py``, ``diagnose.py`` read the result)."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  state, step, cfg = _restore(out, smoke, step)
  path = common.write_hf(os.path.join(out, f"hf_{step}"), state.params, cfg,
                         os.path.join(out, "tokenizer"))
  _log(f"exported step {step} to {path}")
  return path


INDUCTION = dict(lengths=(4, 24), seq_len=512)


def parse_families(families) -> tuple[str, ...]:
  """``families`` (a comma-separated string or a sequence of names) as a tuple of seen
  family names; empty means every seen family. Unknown or held-out names raise."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  if isinstance(families, str):
    families = [f.strip() for f in families.split(",") if f.strip()]
  families = tuple(dict.fromkeys(families))
  bad = [f for f in families if f not in common.seen()]
  if bad:
    raise ValueError(f"--families: {bad} are not seen families of the experiment; choose "
                     f"from {list(common.seen())} (the held-out family is never trained on)")
  return families


def data_ids(rows) -> list[int]:
  """The token ids the supervised rows contain, the markers below ``copy_check.FIRST_ID``
  left out: what stage 0 copies, so it trains the embeddings the next stage reads."""
  from experiments.mechanism import copy_check  # pylint: disable=g-import-not-at-top
  seen = set()
  for r in rows:
    seen.update(r.tokens)
  return sorted(i for i in seen if i >= copy_check.FIRST_ID)


def induction(out: str, *, smoke: bool, steps: int, learning_rate: float,
              vocab_size: int, ids) -> str:
  """Stage 0: ``out/induction`` (HF weights) from ``steps`` steps of short copy rows of
  ``ids``; the accuracy curve goes to ``out/induction_curve.json``. Returns the weights'
  directory."""
  from experiments.mechanism import copy_check  # pylint: disable=g-import-not-at-top
  path = os.path.join(out, "induction")
  if os.path.isfile(os.path.join(path, "config.json")):
    return path
  _log(f"stage 0: {steps} steps of copy rows (in-context copying)")
  curve = copy_check.run(size="smoke" if smoke else "full", offset="variable", steps=steps,
                         alphabet=0, ids=ids, learning_rate=learning_rate,
                         seq_len=INDUCTION["seq_len"], fixed_len=0,
                         every=max(1, min(25, steps)), lengths=INDUCTION["lengths"],
                         vocab_size=vocab_size, save=path, log=_log)
  with open(os.path.join(out, "induction_curve.json"), "w") as f:
    json.dump(curve, f, indent=1)
  return path


DRILLS = ("arithmetic", "equations")


def drill_examples(out: str, vocab, rows, drill: str, n: int) -> list:
  """``n`` drill rows of kind ``drill``: ``arithmetic`` (``arithmetic_chain``'s chains,
  :func:`data.arithmetic_examples`) or ``equations`` (every worked family's equations, drawn
  from the worked steps of the agent ``rows``, :func:`data.equation_examples`)."""
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  if drill == "arithmetic":
    return data.arithmetic_examples(vocab, n, seed=0)
  if drill != "equations":
    raise ValueError(f"drill={drill!r}: expected one of {DRILLS}")
  agent = [r for r in rows if r.role == data.AGENT]
  if agent and not any("works" in r.meta for r in agent):
    raise ValueError(f"{out}/data.pkl records no worked steps (agent rows built without "
                     "--worked, or by an older build); pass --worked and --force, or use "
                     "another --out")
  return data.equation_examples(vocab, agent, n, seed=0)


def adopt_tokenizer(out: str, init_from: str) -> None:
  """A build started from another's weights reads and writes that checkpoint's vocabulary:
  its tokenizer files are copied into ``out/tokenizer`` (once). A different tokenizer
  already there raises, as its ids would not be the ones the weights were trained on."""
  src = os.path.join(init_from, "tokenizer.json")
  if not os.path.isfile(src):
    return  # a checkpoint without tokenizer files: the build trains its own, as before
  path = os.path.join(out, "tokenizer")
  mine = os.path.join(path, "tokenizer.json")
  if os.path.isfile(mine):
    with open(mine, "rb") as a, open(src, "rb") as b:
      if a.read() != b.read():
        raise ValueError(
            f"{path} holds a different tokenizer from --init_from={init_from}, whose weights "
            f"read that one's ids. Remove {path} and {os.path.join(out, 'data.pkl')} (rows "
            "tokenized with it) to build on the checkpoint's vocabulary.")
    return
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  os.makedirs(out, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tokenizer.", dir=out)
  models.copy_tokenizer_files(init_from, tmp)
  os.rename(tmp, path)
  _log(f"tokenizer taken from {init_from}")


def export(out: str, params, model_cfg, tokenizer_dir: str) -> str:
  """Writes ``out/hf`` (weights + tokenizer) atomically."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  return common.write_hf(os.path.join(out, "hf"), params, model_cfg, tokenizer_dir)


def build(out: str, *, smoke: bool, steps: int, batch_size: int, seq_len: int,
          learning_rate: float, designer_rows: int, agent_rows: int, checkpoint_every: int,
          measure_episodes: int, measure_designs: int, num_microbatches: int = 1,
          remat: str = "full", worked: bool = False, copy_rows: int = 0,
          init_from: str = "", induction_steps: int = 0, induction_lr: float = 1e-3,
          induction_mix: int = 0, drill_rows: int = 0, drill: str = "arithmetic",
          designer_balance: str = "skill", families=(), force: bool = False) -> dict:
  """Runs every stage not yet done; returns the measured levels.

  ``families``: a subset of the seen families that the agent transcripts play and the agent
  is measured on (all seen families when empty); the designer rows and the tokenizer always
  cover every seen family.
  """
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.models import ChatTemplate  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import common, measure  # pylint: disable=g-import-not-at-top
  if common.max_family_turns() > common.MAX_TURNS:
    raise ValueError(f"a family allows {common.max_family_turns()} turns, more than the "
                     f"experiment's MAX_TURNS={common.MAX_TURNS}; raise MAX_TURNS.")
  families = parse_families(families) or common.seen()
  if induction_steps and init_from:
    raise ValueError("--induction_steps trains the starting weights itself; drop "
                     "--init_from (or --induction_steps).")
  os.makedirs(out, exist_ok=True)
  if force:
    for name in ("data.pkl", "train", "hf", "levels.json", "train_log.jsonl", "induction",
                 "induction_curve.json", RESUME, "stored_hf"):
      p = os.path.join(out, name)
      if os.path.isdir(p):
        shutil.rmtree(p)
      elif os.path.exists(p):
        os.remove(p)
  shape = common.SMOKE_MODEL if smoke else common.MODEL
  if init_from:
    adopt_tokenizer(out, init_from)
  tok_dir = build_tokenizer(out, shape["vocab_size"], worked)
  vocab = load_tokenizer(tok_dir)
  chat = ChatTemplate(vocab, thinking=False)
  model_cfg = models.get_preset("tiny", **shape)
  hf = os.path.join(out, "hf")
  if not os.path.isfile(os.path.join(hf, "config.json")):
    rows = build_data(out, chat, designer_rows=designer_rows, agent_rows=agent_rows,
                      worked=worked, copy_rows=copy_rows, families=families,
                      designer_balance=designer_balance)
    ids = data_ids(rows) if induction_steps or induction_mix else None
    if induction_steps and not os.path.isfile(os.path.join(out, RESUME)):
      init_from = induction(out, smoke=smoke, steps=induction_steps,
                            learning_rate=induction_lr, vocab_size=shape["vocab_size"],
                            ids=ids)
    if induction_mix:  # stage 0's rows kept in the mix, so the copying is not unlearnt
      from experiments.mechanism import copy_check  # pylint: disable=g-import-not-at-top
      rows = rows + copy_check.examples(induction_mix, 2, 0, None, INDUCTION["lengths"], ids)
      _log(f"mixed {induction_mix} short copy rows into the supervised rows")
    if drill_rows:  # dense arithmetic for the worked steps' results
      rows = rows + drill_examples(out, vocab, rows, drill, drill_rows)
      _log(f"mixed {drill_rows} {drill} drill rows into the supervised rows")
    params = train(out, model_cfg, rows, steps=steps, batch_size=batch_size, seq_len=seq_len,
                   learning_rate=learning_rate, checkpoint_every=checkpoint_every,
                   micro=num_microbatches, remat=remat, init_from=init_from)
    export(out, params, model_cfg, tok_dir)
    _log(f"wrote {hf}")
  levels_path = os.path.join(out, "levels.json")
  if os.path.isfile(levels_path):
    with open(levels_path) as f:
      return json.load(f)
  levels = measure.starting_levels(hf, episodes=measure_episodes, designs=measure_designs,
                                   families=families)
  with open(levels_path, "w") as f:
    json.dump(levels, f, indent=1)
  _log(f"starting levels: {json.dumps(levels)}")
  return levels


# The staged recipe (``--recipe=staged``, the default): the builds that took the agent to
# its starting level on arithmetic_chain and the designer to 13 of 16 valid programs (see
# the mechanism README), then every seen family. Each stage is a ``build`` in
# ``stages/<i>_<name>/`` started from the previous stage's weights and tokenizer; the
# flags not named are ``DEFAULTS`` with one micro-batch.
STAGES = (
    ("worked", dict(designer_rows=0, agent_rows=8000, seq_len=1024, steps=600, worked=True,
                    induction_steps=400, induction_mix=10000, learning_rate=1e-3,
                    measure_designs=0, measure_episodes=40, families="arithmetic_chain")),
    ("drill", dict(designer_rows=0, agent_rows=32000, seq_len=1024, steps=600, worked=True,
                   induction_mix=10000, drill_rows=20000, learning_rate=1e-3,
                   measure_designs=0, measure_episodes=40, families="arithmetic_chain")),
    ("designer", dict(designer_rows=1000, agent_rows=3000, drill_rows=3000, seq_len=2560,
                      steps=480, worked=True, learning_rate=1e-3, measure_designs=16,
                      measure_episodes=40, families="arithmetic_chain")),
    ("families", dict(designer_rows=1000, designer_balance="family", agent_rows=20000,
                      drill="equations", drill_rows=10000, seq_len=2560, steps=1200,
                      worked=True, learning_rate=1e-3, measure_designs=16,
                      measure_episodes=40)),
)


def stage_build(kw: dict, smoke: bool = False) -> dict:
  """A stage's ``build`` arguments; ``smoke`` shrinks every count and step to a tiny run
  and keeps what makes the stage what it is (families, drill kind, stage 0, balance)."""
  unknown = set(kw) - set(DEFAULTS)
  if unknown:
    raise ValueError(f"stage arguments {sorted(unknown)} are not build arguments; valid: "
                     f"{sorted(DEFAULTS)}.")
  out = dict(DEFAULTS, num_microbatches=1, **kw)
  if smoke:
    out.update(steps=2, seq_len=2048, checkpoint_every=2, measure_episodes=1,
               measure_designs=min(out["measure_designs"], 2),
               designer_rows=min(out["designer_rows"], 4), agent_rows=8,
               drill_rows=min(out["drill_rows"], 4),
               induction_mix=min(out["induction_mix"], 16),
               induction_steps=min(out["induction_steps"], 2))
  return out


def stage_dirs(out: str, stages=STAGES, sub: str = "stages") -> list[str]:
  """The build directory of each stage of a staged build in ``out``."""
  return [os.path.join(out, sub, f"{i}_{name}") for i, (name, _) in enumerate(stages)]


# What a stage's copy in the store holds besides its ``hf/``: its records.
STORE_FILES = ("levels.json", "train_log.jsonl", "data_stats.json", "induction_curve.json")


def _stage_args(kw: dict) -> dict:
  """A stage's build arguments as JSON gives them back, less the path it started from."""
  return json.loads(json.dumps({k: v for k, v in sorted(kw.items()) if k != "init_from"}))


def _copy_dir(src: str, dst: str) -> None:
  """Copies the directory ``src`` to ``dst``, replacing ``dst`` only once the copy is
  complete (a sibling temporary directory renamed into place)."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  tmp = tempfile.mkdtemp(prefix=".copy.", dir=os.path.dirname(os.path.abspath(dst)))
  shutil.copytree(src, tmp, dirs_exist_ok=True)
  common.swap_in(tmp, dst)


def _store_copy(d: str, hf: str, store: str, meta: dict) -> str:
  """Writes ``hf`` and ``d``'s records with ``meta`` as ``store/stage.json`` to ``store``,
  replacing what was there only once the new copy is complete."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  parent = os.path.dirname(os.path.abspath(store))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".stage.", dir=parent)
  shutil.copytree(hf, os.path.join(tmp, "hf"))
  for n in STORE_FILES:
    if os.path.isfile(os.path.join(d, n)):
      shutil.copyfile(os.path.join(d, n), os.path.join(tmp, n))
  with open(os.path.join(tmp, "stage.json"), "w") as f:
    json.dump(meta, f, indent=1)
  common.swap_in(tmp, store)
  return store


def publish_stage(d: str, store: str, name: str, kw: dict, *, smoke: bool = False) -> str:
  """Copies the stage in ``d`` to ``store`` with a ``stage.json`` naming the stage, its
  build arguments, the step its weights are at and their SHA-256, so a fresh checkout
  goes on from there: a finished stage (``hf/``, records, levels), or else, for a stage
  that has trained some steps, its latest checkpoint's weights with the optimizer state
  (AdamW's moments in bfloat16, ``hf/opt_state.npz``; ``finished: false``). A
  finished copy already there with other weights raises: other checkouts start from it."""
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  from spade_jax import checkpoint  # pylint: disable=g-import-not-at-top
  held = _read_json(os.path.join(store, "stage.json"))
  hf = os.path.join(d, "hf")
  args = _stage_args(kw)
  if (os.path.isfile(os.path.join(hf, "config.json"))
      and os.path.isfile(os.path.join(d, "levels.json"))):
    meta = {"name": name, "build": args, "finished": True, "step": args["steps"],
            "sha256": common.weights_digest(hf)}
    if held is not None and held.get("finished", True):
      if held["sha256"] != meta["sha256"]:
        raise ValueError(f"{store} already holds stage {held['name']!r} with other weights "
                         f"than {hf}; other checkouts start from the stored one. Remove "
                         f"{store} (and the stages after it) to store this build instead.")
      return store
    _store_copy(d, hf, store, meta)
    _log(f"stored stage {name!r} in {store}")
    return store
  step = None
  if os.path.isdir(os.path.join(d, "train")):
    ckpt = checkpoint.Checkpointer(os.path.join(d, "train"), keep=2)
    step = ckpt.latest_step()
    ckpt.close()
  if step is None:
    raise FileNotFoundError(f"stage {name!r} in {d} has neither finished nor written a "
                            "checkpoint; nothing to store.")
  if held is not None and (held.get("finished", True) or held["step"] >= step):
    return store  # already as far or further
  state, step, cfg = _restore(d, smoke, step)
  snap = common.write_hf(os.path.join(d, f"hf_{step}"), state.params, cfg,
                         os.path.join(d, "tokenizer"))
  save_opt_state(os.path.join(snap, OPT_STATE), state.opt_state)
  meta = {"name": name, "build": args, "finished": False, "step": step,
          "sha256": common.weights_digest(snap)}
  _store_copy(d, snap, store, meta)
  shutil.rmtree(snap)
  _log(f"stored stage {name!r} at step {step} of {args['steps']} in {store}")
  return store


def seed_stage(d: str, store: str, name: str, kw: dict) -> bool:
  """Fills the stage directory ``d`` from its stored copy when ``d`` has no ``hf/`` and no
  checkpoint of its own and ``store`` holds one: a finished stage's weights, tokenizer and
  records, or an unfinished one's weights, optimizer state and step (``resume.json``: the
  build goes on from there). Returns whether it did. A stored copy built with other
  arguments, or whose weights do not match their digest, raises."""
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  meta = _read_json(os.path.join(store, "stage.json"))
  if (meta is None or os.path.isfile(os.path.join(d, "hf", "config.json"))
      or os.path.isdir(os.path.join(d, "train"))):
    return False
  args = _stage_args(kw)
  if meta["name"] != name or meta["build"] != args:
    diff = sorted(k for k in set(meta["build"]) | set(args)
                  if meta["build"].get(k) != args.get(k))
    raise ValueError(f"{store} holds stage {meta['name']!r} built with other arguments than "
                     f"this recipe's stage {name!r} (differing: {diff or ['name']}). Remove "
                     f"{store} and the stages after it to rebuild them, or pass --store='' "
                     "to build without the store.")
  src = os.path.join(store, "hf")
  if common.weights_digest(src) != meta["sha256"]:
    raise ValueError(f"{src}'s weights do not match the SHA-256 in {store}/stage.json; the "
                     "copy is damaged: restore it from version control.")
  os.makedirs(d, exist_ok=True)
  for n in STORE_FILES:  # records first: hf/ is what marks the stage done
    if os.path.isfile(os.path.join(store, n)):
      shutil.copyfile(os.path.join(store, n), os.path.join(d, n))
  if not os.path.isfile(os.path.join(d, "tokenizer", "tokenizer.json")):
    tmp = tempfile.mkdtemp(prefix=".tokenizer.", dir=d)
    models.copy_tokenizer_files(src, tmp)
    if os.path.isdir(os.path.join(d, "tokenizer")):
      shutil.rmtree(os.path.join(d, "tokenizer"))
    os.rename(tmp, os.path.join(d, "tokenizer"))
  finished = meta.get("finished", True)
  dst = os.path.join(d, "hf" if finished else "stored_hf")
  _copy_dir(src, dst)
  if not finished:
    opt = os.path.join(dst, OPT_STATE)
    if not os.path.isfile(opt):
      raise FileNotFoundError(f"{store} holds an unfinished stage without its optimizer "
                              f"state ({OPT_STATE}); store it again with --publish.")
    with open(os.path.join(d, RESUME), "w") as f:
      json.dump({"hf": dst, "step": meta["step"], "opt_state": opt}, f)
  _log(f"stage {name!r} taken from {store}" +
       ("" if finished else f" at step {meta['step']} of {args['steps']}"))
  return True


def store_dirs(store: str, stages=STAGES) -> list[str]:
  """Where each stage of a staged build is stored (``<store>/<i>_<name>``)."""
  return stage_dirs(store, stages, sub="")


def build_staged(out: str, *, smoke: bool = False, stages=STAGES, force: bool = False,
                 store: str = "") -> dict:
  """Runs every stage not yet done, each from the last one's ``hf/``; the last stage's
  checkpoint and levels become ``out/hf`` and ``out/levels.json``. Returns those levels.

  ``store``: a directory of finished stages (``experiments/mechanism/stages`` for the
  command's full-size build): a stage found there is taken instead of built, and each
  stage built is stored there, so the build goes on from any checkout of the project.
  """
  if not stages:
    raise ValueError("a staged build needs at least one stage.")
  prev, levels = "", {}
  stored = store_dirs(store, stages) if store else [""] * len(stages)
  for i, ((name, kw), d, sd) in enumerate(zip(stages, stage_dirs(out, stages), stored)):
    kw = stage_build(kw, smoke)
    if prev:
      if kw["induction_steps"]:
        raise ValueError(f"stage {name!r} sets induction_steps but starts from the stage "
                         "before it; only the first stage may train a stage 0.")
      kw["init_from"] = prev
    _log(f"stage {i + 1}/{len(stages)} ({name}) in {d}")
    if sd and not force:
      seed_stage(d, sd, name, kw)
    levels = build(d, smoke=smoke, force=force, **kw)
    if sd:
      publish_stage(d, sd, name, kw, smoke=smoke)
    prev = os.path.join(d, "hf")
  hf = os.path.join(out, "hf")
  if force or not os.path.isfile(os.path.join(hf, "config.json")):
    _copy_dir(prev, hf)
  with open(os.path.join(out, "levels.json.tmp"), "w") as f:
    json.dump(levels, f, indent=1)
  os.replace(os.path.join(out, "levels.json.tmp"), os.path.join(out, "levels.json"))
  _log(f"wrote {hf} (stage {stages[-1][0]!r}'s checkpoint)")
  return levels


def publish_staged(out: str, store: str, *, smoke: bool = False, stages=STAGES) -> list:
  """Stores the staged build in ``out`` as far as it went: every finished stage, then the
  first unfinished one's latest checkpoint (if it wrote one). Returns the stored
  directories."""
  done = []
  for (name, kw), d, sd in zip(stages, stage_dirs(out, stages), store_dirs(store, stages)):
    finished = os.path.isfile(os.path.join(d, "levels.json"))
    if not finished and not os.path.isdir(os.path.join(d, "train")):
      break
    done.append(publish_stage(d, sd, name, stage_build(kw, smoke), smoke=smoke))
    if not finished:
      break
  return done


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from experiments.mechanism import common  # pylint: disable=g-import-not-at-top
  smoke = _SMOKE.value
  out = _OUT.value or common.warm_start_dir(smoke)
  if _SNAPSHOT.value:
    print(snapshot(out, smoke=smoke, step=_SNAPSHOT_STEP.value or None))
    return
  store = common.STORE if _STORE.value is None else _STORE.value
  if smoke and _STORE.value is None:
    store = ""  # the smoke build never touches the project's store
  if _PUBLISH.value:
    if not store:
      raise app.UsageError("--publish stores finished stages in --store; give a directory.")
    for d in publish_staged(out, store, smoke=smoke):
      print(d)
    return
  if _RECIPE.value == "staged":
    # The single recipe's flags are named as build's arguments; the stages fix those.
    given = [f"--{n}" for n in DEFAULTS if flags.FLAGS[n].present]
    if given:
      raise app.UsageError(f"{', '.join(given)} set the single recipe's build; the staged "
                           "recipe's stages are fixed (warm_start.STAGES). Add "
                           "--recipe=single to build from the flags.")
    levels = build_staged(out, smoke=smoke, force=_FORCE.value, store=store)
    print(json.dumps(levels, indent=1))
    record = _RECORD.value or ("warm_start" if not smoke and not _OUT.value else "")
    if record:
      path = write_staged_results(out, levels, os.path.join(common.RESULTS, record + ".json"))
      print(f"wrote {path}")
    return
  kw = dict(steps=_STEPS.value, batch_size=_BATCH.value, seq_len=_SEQ.value,
            learning_rate=_LR.value, designer_rows=_DESIGNER.value,
            agent_rows=_AGENT.value, checkpoint_every=_CKPT.value,
            measure_episodes=_MEASURE.value, measure_designs=_MEASURE_DESIGNS.value,
            num_microbatches=_MICRO.value, remat=_REMAT.value, worked=_WORKED.value,
            copy_rows=_COPY.value, init_from=_INIT.value,
            induction_steps=_INDUCTION.value, induction_lr=_INDUCTION_LR.value,
            induction_mix=_INDUCTION_MIX.value, drill_rows=_DRILL.value,
            drill=_DRILL_KIND.value, designer_balance=_BALANCE.value,
            families=_FAMILIES.value)
  if smoke:
    kw.update(SMOKE_BUILD)
  levels = build(out, smoke=smoke, force=_FORCE.value, **kw)
  print(json.dumps(levels, indent=1))
  record = _RECORD.value or ("warm_start" if not smoke and not _OUT.value else "")
  if record:
    path = write_results(out, kw, levels, os.path.join(common.RESULTS, record + ".json"))
    print(f"wrote {path}")


def _read_json(path: str):
  """The JSON in ``path``, or None when there is no such file."""
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def _loss_curve(out: str) -> list:
  """A build's logged [step, loss] pairs (``train_log.jsonl``)."""
  log = os.path.join(out, "train_log.jsonl")
  if not os.path.isfile(log):
    return []
  with open(log) as f:
    return [[r["step"], r.get("loss")] for r in map(json.loads, filter(str.strip, f))]


def _record(out: str, build_kw: dict, levels: dict) -> dict:
  return {"build": build_kw, "data": _read_json(os.path.join(out, "data_stats.json")),
          "induction": _read_json(os.path.join(out, "induction_curve.json")),
          "loss": _loss_curve(out), "levels": levels}


def _write_record(record: dict, path: str) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(record, f, indent=1)
  return path


def write_results(out: str, build_kw: dict, levels: dict, path: str) -> str:
  """The warm start's record for the report: build settings, data, loss curve, levels."""
  return _write_record(_record(out, build_kw, levels), path)


def write_staged_results(out: str, levels: dict, path: str, stages=STAGES) -> str:
  """A staged build's record: the last stage's record (its data, loss curve and the
  warm start's levels) with every stage's arguments, loss curve and levels."""
  dirs = stage_dirs(out, stages)
  record = _record(dirs[-1], {"recipe": "staged"}, levels)
  record["stages"] = [{"name": name, "build": stage_build(kw), "loss": _loss_curve(d),
                       "levels": _read_json(os.path.join(d, "levels.json"))}
                      for (name, kw), d in zip(stages, dirs)]
  return _write_record(record, path)


# What `python -m experiments.mechanism.warm_start --recipe=single` builds (the flags'
# defaults).
DEFAULTS = dict(steps=300, batch_size=8, seq_len=2560, learning_rate=2e-3, designer_rows=1000,
                agent_rows=4000, checkpoint_every=10, measure_episodes=8, measure_designs=16,
                num_microbatches=4, remat="none", worked=False, copy_rows=0, init_from="",
                induction_steps=0, induction_lr=1e-3, induction_mix=0, drill_rows=0,
                drill="arithmetic", designer_balance="skill", families="")
SMOKE_BUILD = dict(steps=3, batch_size=8, seq_len=2048, num_microbatches=1, designer_rows=4,
                   agent_rows=8, checkpoint_every=2, measure_episodes=1, measure_designs=2,
                   worked=True, induction_steps=2, induction_mix=16, drill_rows=4)


def _define_flags() -> None:
  """The command line's flags (defined only when run as a program)."""
  global _PUBLISH, _STORE, _SNAPSHOT, _SNAPSHOT_STEP, _RECIPE, _BALANCE, _DRILL, _DRILL_KIND, _FAMILIES, _INDUCTION, _INDUCTION_LR, _INDUCTION_MIX, _COPY, _INIT, _WORKED, _AGENT, _BATCH, _CKPT, _DESIGNER, _FORCE, _LR, _MEASURE, _MEASURE_DESIGNS, _MICRO, _OUT, _RECORD, _REMAT, _SEQ, _SMOKE, _STEPS
  _RECIPE = flags.DEFINE_enum(
      "recipe", "staged", ["staged", "single"], "'staged': the stages of STAGES, each from "
      "the last one's weights (13-28 h on 2 cores by CPU, each stage resumable and "
      "storable); 'single': one build from the flags below.")
  _SNAPSHOT = flags.DEFINE_bool(
      "snapshot", False, "Only export --out's latest checkpoint (or --snapshot_step's) to "
      "hf_<step>/ and exit; the build itself may keep running (a staged build's stage is "
      "--out=<warm start>/stages/<i>_<name>).")
  _STORE = flags.DEFINE_string(
      "store", None, "Directory of finished stages of the staged recipe: stages found there "
      "are taken instead of built, and each stage built is stored there (default: "
      "experiments/mechanism/stages, committed with the project, so a build goes on from any "
      "checkout; none for --smoke; '' turns it off).")
  _PUBLISH = flags.DEFINE_bool(
      "publish", False, "Only store the finished stages of the staged build in --out in "
      "--store, and exit.")
  _SNAPSHOT_STEP = flags.DEFINE_integer("snapshot_step", 0, "The step --snapshot exports "
                                        "(default: the latest).")
  _STEPS = flags.DEFINE_integer("steps", 300, "Optimizer steps.")
  _BATCH = flags.DEFINE_integer("batch_size", 8, "Packed rows per step.")
  _SEQ = flags.DEFINE_integer("seq_len", 2560, "Tokens per packed row.")
  _MICRO = flags.DEFINE_integer("num_microbatches", 4, "Micro-batches per step (memory).")
  _REMAT = flags.DEFINE_enum("remat", "none", ["none", "full"],
                             "Layer rematerialisation (\"full\": less memory; on 2 CPU cores "
                             "no slower).")
  _LR = flags.DEFINE_float("learning_rate", 2e-3, "Peak learning rate (cosine decay).")
  _DESIGNER = flags.DEFINE_integer("designer_rows", 1000, "Designer prompt -> program rows.")
  _BALANCE = flags.DEFINE_enum(
      "designer_balance", "skill", ["skill", "family"], "Designer rows per skill, a skill's "
      "families sharing its rows ('skill'), or per family ('family').")
  _AGENT = flags.DEFINE_integer("agent_rows", 4000, "Agent transcripts.")
  _WORKED = flags.DEFINE_bool("worked", False,
                              "Agent turns that follow the plan write the family's worked step "
                              "before the box (e.g. '19 + 7 = 26 \\boxed{26}'); slips stay "
                              "bare guesses.")
  _COPY = flags.DEFINE_integer("copy_rows", 0, "Copy rows (a random text, then the same "
                               "text again, only the repeat trained): in-context copying.")
  _INIT = flags.DEFINE_string("init_from", "", "An HF directory (e.g. another build's hf/) "
                              "whose weights start this build, with a fresh optimizer and "
                              "schedule; ignored once the build has a checkpoint.")
  _INDUCTION = flags.DEFINE_integer(
      "induction_steps", 0, "Stage 0: steps of short copy rows of random ids before the "
      "supervised rows, from which training starts (an in-context copying circuit).")
  _INDUCTION_LR = flags.DEFINE_float("induction_lr", 1e-3, "Peak learning rate of stage 0.")
  _DRILL = flags.DEFINE_integer(
      "drill_rows", 0, "Rows of worked arithmetic equations ('19 + 7 = 26'), only the "
      "results trained, mixed into the supervised rows (--drill says which).")
  _DRILL_KIND = flags.DEFINE_enum(
      "drill", "arithmetic", list(DRILLS), "The drill rows' equations: 'arithmetic' "
      "(arithmetic_chain's chains) or 'equations' (those of every worked family's steps, "
      "operands drawn from the agent rows' worked steps; needs --worked).")
  _INDUCTION_MIX = flags.DEFINE_integer(
      "induction_mix", 0, "Short copy rows of the data's ids (stage 0's kind) mixed into the "
      "supervised rows, so in-context copying is kept while the rest is learnt.")
  _FAMILIES = flags.DEFINE_string(
      "families", "", "Comma-separated seen families the agent transcripts play and the "
      "agent is measured on (default: all seen families); designer rows cover all of them.")
  _CKPT = flags.DEFINE_integer("checkpoint_every", 10, "Steps between checkpoints.")
  _MEASURE = flags.DEFINE_integer("measure_episodes", 8,
                                  "Medium-level episodes per seen family when measuring.")
  _MEASURE_DESIGNS = flags.DEFINE_integer("measure_designs", 16, "Designer samples measured.")
  _SMOKE = flags.DEFINE_bool("smoke", False, "A minutes-long build of a tiny model (tests).")
  _FORCE = flags.DEFINE_bool("force", False, "Rebuild data, training and export.")
  _OUT = flags.DEFINE_string("out", "", "Build directory (default: the cache's).")
  _RECORD = flags.DEFINE_string("record", "", "Write the build's record to results/NAME.json "
                                "(default: warm_start for the default build, none with --out "
                                "or --smoke).")


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(main))
