r"""Where the learning recipe's update spends its time, beside torch.

  python -m experiments.benchmarks.update_breakdown --rounds=3
  python -m experiments.benchmarks.update_breakdown --rounds=3 --torch=false \
      --variants=before,after,mlp_grad=autodiff,remat=full

Our side: random weights of the `smollm2_135m_instruct` architecture (float32; no
GGUF file needed) and the learning recipe's (`experiments/configs/learn.py`) model,
train, loss and optimizer sections on one CPU device: its packed batch of 8 rows x 160
tokens, each row two plays of a 37-token prompt and 32 completion tokens sampled at
T 0.7 (16 plays, as 2 problems x 8 plays). Each variant is timed three ways, each the
jitted program on its own:

  forward   the policy log-probs (`Trainer._logps`), no gradient;
  fwd+bwd   the gradient of the step's loss (`Trainer._micro_terms`);
  step      the whole `Trainer.step` (forward, backward, AdamW; donated state).

Variants are names in `VARIANTS`, or settings joined by "+" (e.g.
`mlp_grad=manual+scan_layers=false`), each a `ModelConfig` or `TrainConfig` field.
All variants share one train state (the same parameter tree and shardings), so
memory does not grow with them.

Torch side (`--torch`): transformers' `LlamaForCausalLM` of the same shape, as TRL's
GRPOTrainer lays the batch out: 16 unpacked rows of 69 tokens (about the ~1,100
positions TRL pads the recipe's plays to), logits of the completion positions only
(`logits_to_keep`), tempered log-softmax, the token-mean GRPO loss (one update per
generation: ratio exp(logp - stop_gradient(logp))), gradient clip, AdamW.

Rounds interleave every variant (and torch) so that load on a shared machine hits
them alike; medians over rounds are printed, then each variant's step against the
first variant's and against torch's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app
from absl import flags

from experiments.benchmarks import common

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (after one warm-up round).")
_VARIANTS = flags.DEFINE_list("variants", ["before", "after"],
                              "Variants: names in VARIANTS or key=value+key=value.")
_TORCH = flags.DEFINE_bool("torch", True, "Also time transformers' LlamaForCausalLM.")
_PARTS = flags.DEFINE_list("parts", ["forward", "fwd_bwd", "step"],
                           "Which programs to time.")

ROWS, SEQ, PROMPT, COMPLETION = 8, 160, 37, 32
PLAYS = 16

# Named variants: settings over the recipe's ("before": the gated MLP differentiated
# by JAX; "after": its hand-written VJP).
VARIANTS = {
    "before": dict(mlp_grad="autodiff"),
    "after": dict(mlp_grad="manual"),
    "unrolled": dict(mlp_grad="manual", scan_layers="false"),
    "unchunked": dict(mlp_grad="manual", logprob_chunk="0"),
    "sampler_old": dict(mlp_grad="manual", old_logps="sampler"),
}


def _median(xs):
  return statistics.median(xs) if xs else float("nan")


def _parse(spec: str) -> dict[str, str]:
  if spec in VARIANTS:
    return dict(VARIANTS[spec])
  out = {}
  for part in spec.split("+"):
    if "=" not in part:
      raise app.UsageError(f"--variants: {spec!r} is neither a name in "
                           f"{sorted(VARIANTS)} nor key=value settings joined by '+'.")
    k, v = part.split("=", 1)
    out[k.strip()] = v.strip()
  return out


def _convert(field: dataclasses.Field, value: str):
  if field.type in ("bool", bool):
    if value.lower() not in ("true", "false"):
      raise app.UsageError(f"{field.name}={value!r}: expected true or false.")
    return value.lower() == "true"
  for kind in (int, float):
    if field.type in (kind.__name__, kind):
      return kind(value)
  return value


def packed_batch(vocab: int, seed: int = 0) -> dict:
  """The recipe's packed batch: two plays (prompt + completion) per row of 160."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  n = PROMPT + COMPLETION
  b = {k: np.zeros((ROWS, SEQ), dt) for k, dt in (
      ("tokens", np.int32), ("positions", np.int32), ("segment_ids", np.int32),
      ("loss_mask", bool), ("sampler_logps", np.float32), ("advantages", np.float32),
      ("role", np.int32), ("temperature", np.float32))}
  b["temperature"][:] = 1.0
  for r in range(ROWS):
    for j in range(PLAYS // ROWS):
      s = slice(j * n, (j + 1) * n)
      b["tokens"][r, s] = rng.integers(3, vocab, n)
      b["positions"][r, s] = np.arange(n)
      b["segment_ids"][r, s] = j + 1
      b["loss_mask"][r, j * n + PROMPT:(j + 1) * n] = True
      b["sampler_logps"][r, s] = rng.uniform(-4.0, 0.0, n)
      b["advantages"][r, s] = rng.normal()
      b["role"][r, s] = 1
      b["temperature"][r, s] = 0.7
  return b


class Ours:
  """One variant of our update: its forward, gradient and step programs."""

  def __init__(self, name: str, settings: dict[str, str], base, batch):
    import jax  # pylint: disable=g-import-not-at-top
    from spade_jax import parallel, rl  # pylint: disable=g-import-not-at-top
    model, train, loss, opt, rules = base
    fields = {"model": {f.name: f for f in dataclasses.fields(model)},
              "train": {f.name: f for f in dataclasses.fields(train)}}
    over = {"model": {}, "train": {}}
    for k, v in settings.items():
      where = next((w for w in over if k in fields[w]), None)
      if where is None:
        raise app.UsageError(f"Variant {name!r}: {k!r} is not a ModelConfig or "
                             "TrainConfig field.")
      over[where][k] = _convert(fields[where][k], v)
    model = dataclasses.replace(model, **over["model"])
    train = dataclasses.replace(train, **over["train"])
    self.name, self.jax = name, jax
    mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=1, rules=rules),
                              jax.devices()[:1])
    self.trainer = tr = rl.Trainer(model, train, loss, opt, mesh, parallel.RULE_SETS[rules])
    self.batch = tr._put(batch)  # pylint: disable=protected-access
    sharding = lambda: parallel.activation_sharding(mesh, tr.rules)

    def fwd(p):
      with sharding():
        return tr._logps(p, self.batch)  # pylint: disable=protected-access

    def grad(p):
      with sharding():
        return jax.grad(lambda q: tr._micro_terms(q, q, self.batch)[0])(p)  # pylint: disable=protected-access

    self.programs = {"forward": jax.jit(fwd), "fwd_bwd": jax.jit(grad)}

  def run(self, part: str, state):
    """Runs one program; returns (seconds, the state to use next)."""
    jax = self.jax
    t0 = time.perf_counter()
    if part == "step":
      state, m = self.trainer.step(state, self.batch)
      jax.block_until_ready((state, m))
    else:
      jax.block_until_ready(self.programs[part](state.params))
    return time.perf_counter() - t0, state


class Torch:
  """transformers' LlamaForCausalLM on TRL's layout of the same plays."""

  name = "torch"

  def __init__(self, model_cfg, lr: float):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch = torch
    torch.manual_seed(0)
    c = model_cfg
    hf = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_dim,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_eps, tie_word_embeddings=c.tie_embeddings,
        max_position_embeddings=c.max_position_embeddings)
    self.model = transformers.LlamaForCausalLM(hf).float().train()
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.98),
                                 weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    self.ids = torch.randint(3, c.vocab_size, (PLAYS, PROMPT + COMPLETION), generator=g)
    self.adv = torch.randn(PLAYS, 1, generator=g)

  def _loss(self):
    torch = self.torch
    out = self.model(input_ids=self.ids, logits_to_keep=COMPLETION + 1)
    logits = out.logits[:, :-1] / 0.7
    tgt = self.ids[:, -COMPLETION:]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
    ratio = torch.exp(logp - logp.detach())
    return -(ratio * self.adv).mean()

  def run(self, part: str, state):
    torch = self.torch
    t0 = time.perf_counter()
    if part == "forward":
      with torch.no_grad():
        self._loss()
    else:
      self.opt.zero_grad(set_to_none=True)
      self._loss().backward()
      if part == "step":
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
    return time.perf_counter() - t0, state


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax.models import num_params  # pylint: disable=g-import-not-at-top
  base = common.recipe_sections()
  model = base[0]
  batch = packed_batch(model.vocab_size)
  sides = [Ours(v, _parse(v), base, batch) for v in _VARIANTS.value]
  if _TORCH.value:
    sides.append(Torch(model, base[3].learning_rate))
  state = sides[0].trainer.init_state(jax.random.key(0))
  parts = [p for p in ("forward", "fwd_bwd", "step") if p in _PARTS.value]
  print(f"{num_params(model) / 1e6:.0f}M parameters, batch {ROWS} x {SEQ} packed "
        f"({PLAYS} plays of {PROMPT}+{COMPLETION}), {jax.devices()[0].platform}; "
        f"{_ROUNDS.value} rounds after a warm-up", flush=True)
  times = {(s.name, p): [] for s in sides for p in parts}
  for r in range(_ROUNDS.value + 1):
    for s in sides:
      for p in parts:
        dt, state = s.run(p, state)
        if r:
          times[(s.name, p)].append(dt)
    if r:
      print(f"round {r}: " + "  ".join(
          f"{s.name} {times[(s.name, 'step' if 'step' in parts else parts[-1])][-1]:.2f}s"
          for s in sides), flush=True)
  med = {k: _median(v) for k, v in times.items()}
  width = max(len(s.name) for s in sides)
  print(f"\nmedians (s) over {_ROUNDS.value} rounds")
  print(f"{'variant':<{width}}  " + "  ".join(f"{p:>8}" for p in parts))
  for s in sides:
    print(f"{s.name:<{width}}  " + "  ".join(f"{med[(s.name, p)]:8.2f}" for p in parts))
  last = parts[-1]
  first = sides[0].name
  for s in sides[1:]:
    print(f"{last}: {s.name} / {first} = {med[(s.name, last)] / med[(first, last)]:.2f}x")
  if _TORCH.value:
    for s in sides[:-1]:
      print(f"{last}: {s.name} / torch = {med[(s.name, last)] / med[('torch', last)]:.2f}x")


if __name__ == "__main__":
  app.run(main)
