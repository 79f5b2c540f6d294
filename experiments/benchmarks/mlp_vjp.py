r"""The gated MLP's backward alone: autodiff against the hand-written VJP.

  python -m experiments.benchmarks.mlp_vjp --rounds=5

At the learning recipe's shapes (SmolLM2-135M: width 576, MLP 1,536, 30 layers; 8 x
160 tokens, float32), a residual stack `x <- x + mlp(x)` scanned over the layers, as
the decoder runs it. Times the forward + backward (gradients of every weight and of
the input) of `ModelConfig.mlp_grad="autodiff"` and `"manual"` (`qwen3.gated_mlp`),
interleaved round by round in one process so that load on a shared machine hits both
alike; prints medians and the largest relative gradient difference.
"""

from __future__ import annotations

import statistics
import time

from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (after one warm-up round).")
_LAYERS = flags.DEFINE_integer("layers", 30, "MLP layers in the scanned stack.")
_TOKENS = flags.DEFINE_integer("tokens", 8 * 160, "Tokens (rows of 160).")
_WIDTH = flags.DEFINE_integer("d_model", 576, "Residual width.")
_MLP = flags.DEFINE_integer("mlp_dim", 1536, "MLP width.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spade_jax.models import qwen3  # pylint: disable=g-import-not-at-top
  L, D, F = _LAYERS.value, _WIDTH.value, _MLP.value
  if _TOKENS.value % 160:
    raise app.UsageError(f"--tokens={_TOKENS.value} must be a multiple of 160.")
  B, T = _TOKENS.value // 160, 160
  k = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(k[0], (B, T, D))
  w = {"gate": 0.02 * jax.random.normal(k[1], (L, D, F)),
       "up": 0.02 * jax.random.normal(k[2], (L, D, F)),
       "down": 0.02 * jax.random.normal(k[3], (L, F, D))}
  dout = jax.random.normal(k[4], (B, T, D))
  mlps = {"autodiff": qwen3._gated_mlp_forward,  # pylint: disable=protected-access
          "manual": qwen3.gated_mlp}

  def program(mlp):
    def loss(w, x):
      def layer(x, lw):
        return x + mlp(x, lw["gate"], lw["up"], lw["down"]), None
      y, _ = jax.lax.scan(layer, x, w)
      return jnp.sum(y * dout)
    return jax.jit(jax.grad(loss, argnums=(0, 1)))

  progs = {name: program(f) for name, f in mlps.items()}
  grads = {name: jax.block_until_ready(p(w, x)) for name, p in progs.items()}
  diff = max(
      float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
      for a, b in zip(jax.tree.leaves(grads["manual"]), jax.tree.leaves(grads["autodiff"])))
  times = {name: [] for name in progs}
  for r in range(_ROUNDS.value):
    for name, p in progs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(p(w, x))
      times[name].append(time.perf_counter() - t0)
    print(f"round {r + 1}: " + "  ".join(f"{n} {t[-1]:.3f}s" for n, t in times.items()),
          flush=True)
  med = {n: statistics.median(t) for n, t in times.items()}
  print(f"{L} layers, {B * T} tokens, D {D}, F {F}: forward + backward medians over "
        f"{_ROUNDS.value} rounds: autodiff {med['autodiff']:.3f}s, manual "
        f"{med['manual']:.3f}s ({med['manual'] / med['autodiff']:.2f}x); largest relative "
        f"gradient difference {diff:.1e}")


if __name__ == "__main__":
  app.run(main)
