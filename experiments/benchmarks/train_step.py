"""GRPO train-step throughput on CPU: spade_jax's update beside Tunix's learner.

Same random Qwen3-shaped model, batch and lengths for both: 2 prompts x 4
generations, 32-token prompts, 64 completion tokens (8 sequences of 96
tokens), KL coefficient 0.04 (k3), clip 0.2, sequence-mean-token-mean
aggregation, AdamW. Sizes: "tiny" (~2.5M parameters) and "50m" (~48M).

  bash experiments/benchmarks/peers_venv.sh
  .venv-peers/bin/python experiments/benchmarks/train_step.py --sizes=tiny,50m

Ours: one jitted update = policy forward/backward (chunked log-probs), the
reference forward (KL > 0) and the optimizer; no rollout. Tunix:
`GRPOLearner` with `RLCluster` and the vanilla rollout; its phases (rollout,
reference log-probs, actor update) are timed by wrapping the cluster's
methods. The like-for-like figure is our update against Tunix's reference +
actor update; totals are printed too. Runs are interleaved round by round
and reported as medians, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

PROMPTS, GENERATIONS, PROMPT_LEN, NEW_TOKENS = 2, 4, 32, 64
BETA, EPS, LR = 0.04, 0.2, 1e-6
SIZES = {
    "tiny": dict(vocab_size=1024, d_model=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=32, mlp_dim=384),
    "50m": dict(vocab_size=32000, d_model=512, num_layers=8, num_heads=8,
                num_kv_heads=4, head_dim=64, mlp_dim=2048),
}


def _median(xs):
  return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------
# spade_jax
# ---------------------------------------------------------------------------


class Ours:
  """spade_jax `Trainer` on one CPU device."""

  name = "spade_jax"

  def __init__(self, size: str, chunk: int):
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
    from spade_jax.models import ModelConfig, num_params  # pylint: disable=g-import-not-at-top
    self.jax, self.np = jax, np
    self.cfg = ModelConfig(**SIZES[size], tie_embeddings=True)
    self.params = num_params(self.cfg)
    mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
    b, t = PROMPTS * GENERATIONS, PROMPT_LEN + NEW_TOKENS
    self.trainer = rl.Trainer(
        self.cfg, rl.TrainConfig(b, t, logprob_chunk=chunk),
        rl.LossConfig(eps_low=EPS, eps_high=EPS, kl_coef=BETA, kl_estimator="k3",
                      aggregation="seq_mean_token_mean", tis_cap=None),
        rl.OptimizerConfig(learning_rate=LR), mesh, parallel.RULE_SETS["fsdp"])
    self.state = self.trainer.init_state(jax.random.key(0))
    rng = np.random.default_rng(0)
    mask = np.zeros((b, t), bool)
    mask[:, PROMPT_LEN:] = True
    self.batch = dict(
        tokens=rng.integers(3, self.cfg.vocab_size, (b, t)).astype(np.int32),
        positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
        segment_ids=np.ones((b, t), np.int32), loss_mask=mask,
        sampler_logps=np.full((b, t), -np.log(self.cfg.vocab_size), np.float32),
        advantages=rng.normal(size=b).astype(np.float32),
        role=np.ones((b,), np.int32))

    jax = self.jax
    tr = self.trainer
    dev = {k: jax.device_put(jax.numpy.asarray(
        np.broadcast_to(v[:, None], (b, t)) if v.ndim == 1 else v,
        rl.BATCH_FIELDS[k]), tr.batch_shardings[k]) for k, v in self.batch.items()}
    self.dev_batch = dev
    # Pieces of the update, jitted on their own for the breakdown.
    self.fwd = jax.jit(lambda p: tr._logps(p, dev))
    self.fwd_bwd = jax.jit(jax.grad(lambda p: tr._micro_terms(p, p, dev)[0]))

  def breakdown(self) -> dict[str, float]:
    """One timing each of the policy forward and of forward+backward (+ reference)."""
    out = {}
    for name, f in (("logps_fwd", self.fwd), ("fwd_bwd", self.fwd_bwd)):
      self.jax.block_until_ready(f(self.state.params))  # compile
      t0 = time.perf_counter()
      self.jax.block_until_ready(f(self.state.params))
      out[name] = time.perf_counter() - t0
    return out

  def step(self) -> dict[str, float]:
    t0 = time.perf_counter()
    self.state, m = self.trainer.step(self.state, self.dev_batch)
    self.jax.block_until_ready((self.state, m))
    dt = time.perf_counter() - t0
    return {"update": dt, "total": dt}


# ---------------------------------------------------------------------------
# Tunix
# ---------------------------------------------------------------------------


class _IdTokenizer:
  """Whitespace-separated integers <-> ids (what TokenizerAdapter needs)."""

  def __init__(self, vocab):
    self.vocab = vocab

  def encode(self, text, **_):
    if hasattr(text, "tolist"):  # numpy string scalars / 0-d arrays
      text = text.tolist()
    if isinstance(text, (list, tuple)):
      text = " ".join(map(str, text))
    return [int(w) for w in str(text).split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 1

  def eos_id(self):
    return self.vocab - 1

  def pad_id(self):
    return 0


class Tunix:
  """Tunix `GRPOLearner` with the vanilla rollout on one CPU device."""

  name = "tunix"

  def __init__(self, size: str, steps: int):
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top
    from flax import nnx  # pylint: disable=g-import-not-at-top
    from jax.sharding import AxisType  # pylint: disable=g-import-not-at-top
    from tunix.models.qwen3 import model as tmodel  # pylint: disable=g-import-not-at-top
    from tunix.rl import rl_cluster as rlc  # pylint: disable=g-import-not-at-top
    from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
    from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top
    s = SIZES[size]
    mcfg = tmodel.ModelConfig(
        num_layers=s["num_layers"], vocab_size=s["vocab_size"], embed_dim=s["d_model"],
        hidden_dim=s["mlp_dim"], num_heads=s["num_heads"], head_dim=s["head_dim"],
        num_kv_heads=s["num_kv_heads"], rope_theta=1_000_000, norm_eps=1e-6,
        use_tied_embedding=True)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                         axis_types=(AxisType.Auto,) * 2)
    with mesh:
      actor = tmodel.Qwen3(mcfg, rngs=nnx.Rngs(0))
      ref = tmodel.Qwen3(mcfg, rngs=nnx.Rngs(0))
    self.params = sum(x.size for x in jax.tree.leaves(nnx.state(actor, nnx.Param)))
    b = PROMPTS * GENERATIONS
    train_cfg = rlc.RLTrainingConfig(
        actor_optimizer=optax.adamw(LR, b1=0.9, b2=0.98, weight_decay=0.1),
        eval_every_n_steps=10 ** 9, max_steps=steps, mini_batch_size=PROMPTS,
        train_micro_batch_size=PROMPTS)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=NEW_TOKENS, max_prompt_length=PROMPT_LEN,
        temperature=0.9, top_p=1.0, top_k=None,
        kv_cache_size=1024)
    cluster = rlc.RLCluster(
        actor=actor, reference=ref, tokenizer=_IdTokenizer(s["vocab_size"]),
        cluster_config=rlc.ClusterConfig(
            role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh,
                          rlc.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=train_cfg, rollout_config=rollout))
    self.times: dict[str, list[float]] = {"rollout": [], "ref_logps": [], "update": []}
    self.ends: list[float] = []
    self._wrap(cluster, "generate", "rollout")
    self._wrap(cluster, "get_ref_per_token_logps", "ref_logps")
    self._wrap(cluster, "update_actor", "update", mark_end=True)
    rng = np.random.default_rng(0)
    # Arrays, not lists: Tunix repeats every leaf G times along axis 0.
    self.data = [{"prompts": np.array([
        " ".join(map(str, rng.integers(3, s["vocab_size"] - 1, PROMPT_LEN)))
        for _ in range(PROMPTS)])} for _ in range(steps)]
    self.learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(num_generations=GENERATIONS, beta=BETA,
                                            epsilon=EPS),
        reward_fns=lambda prompts, completions, **_: [
            float(len(c) % 7) for c in completions])
    self.b = b

  def _wrap(self, obj, method, key, mark_end=False):
    import jax  # pylint: disable=g-import-not-at-top
    real = getattr(obj, method)

    def timed(*a, **k):
      t0 = time.perf_counter()
      out = real(*a, **k)
      jax.block_until_ready(out)
      t1 = time.perf_counter()
      self.times[key].append(t1 - t0)
      if mark_end:
        self.ends.append(t1)
      return out
    setattr(obj, method, timed)

  def run(self):
    """Runs all steps (Tunix drives its own loop)."""
    self.learner.train(self.data)


# ---------------------------------------------------------------------------


def _row(name, params, tokens, parts, total):
  cells = " | ".join(f"{k} {v * 1e3:7.1f} ms" for k, v in parts.items())
  print(f"  {name:10s} {params / 1e6:6.2f}M params | {cells} | total {total * 1e3:7.1f} ms"
        f" | {tokens / total:8.0f} train tok/s", flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--sizes", default="tiny,50m")
  p.add_argument("--steps", type=int, default=6, help="measured steps per run")
  p.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
  p.add_argument("--peers", default="tunix", help="'' to run ours only")
  p.add_argument("--chunk", type=int, default=512, help="our log-prob chunk")
  args = p.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
  tokens = PROMPTS * GENERATIONS * (PROMPT_LEN + NEW_TOKENS)
  for size in args.sizes.split(","):
    print(f"\n== {size}: {PROMPTS} prompts x {GENERATIONS} generations, "
          f"{PROMPT_LEN}+{NEW_TOKENS} tokens, beta {BETA}", flush=True)
    ours_t, tunix_t = [], {"rollout": [], "ref_logps": [], "update": [], "total": []}
    ours = Ours(size, args.chunk)
    t0 = time.perf_counter()
    ours.step()
    print(f"  spade_jax first step (compile) {time.perf_counter() - t0:.1f} s", flush=True)
    tunix_params = None
    for r in range(args.rounds):
      ours_t += [ours.step()["update"] for _ in range(args.steps)]
      if "tunix" in args.peers:
        try:
          t = Tunix(size, args.steps + 1)
        except ImportError as e:
          print(f"  tunix unavailable ({e}); run with .venv-peers/bin/python", flush=True)
          args.peers = ""
          continue
        t0 = time.perf_counter()
        t.run()
        if r == 0:
          print(f"  tunix run of {args.steps + 1} steps incl. compile "
                f"{time.perf_counter() - t0:.1f} s", flush=True)
        tunix_params = t.params
        for k in ("rollout", "ref_logps", "update"):
          tunix_t[k] += t.times[k][1:]  # drop the compiling step
        tunix_t["total"] += [b - a for a, b in zip(t.ends[:-1], t.ends[1:])]
    ou = _median(ours_t)
    parts = {}
    for _ in range(3):
      for k, v in ours.breakdown().items():
        parts.setdefault(k, []).append(v)
    parts = {k: _median(v) for k, v in parts.items()}
    parts["update"] = ou
    _row("spade_jax", ours.params, tokens, parts, ou)
    print(f"  (spade_jax parts: logps_fwd = one policy forward with chunked log-probs; "
          f"fwd_bwd = policy forward+backward and reference forward; update = the "
          f"whole jitted step incl. AdamW)", flush=True)
    if tunix_t["update"]:
      med = {k: _median(v) for k, v in tunix_t.items()}
      _row("tunix", tunix_params, tokens,
           {k: med[k] for k in ("rollout", "ref_logps", "update")}, med["total"])
      like = med["ref_logps"] + med["update"]
      print(f"  like for like (our update incl. reference forward vs Tunix ref "
            f"log-probs + actor update): {ou * 1e3:.1f} ms vs {like * 1e3:.1f} ms, "
            f"ratio ours/tunix {ou / like:.2f}; vs Tunix actor update alone "
            f"{ou / med['update']:.2f}", flush=True)


if __name__ == "__main__":
  main()
