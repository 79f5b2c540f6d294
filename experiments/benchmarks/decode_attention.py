r"""Decode step time with each decode attention kernel, paired in one process.

  python -m experiments.benchmarks.decode_attention [--models=tiny,50m] \
      [--configs=8x64x128,8x512x128,8x64x512] [--repeats=4]

A decode step's attention is chosen by `ModelConfig.decode_attention`
(`attention.DECODE_ATTENTION`). The default, "auto", on CPU (a) computes a
step's scores as a sum of E broadcast products over the length-last keys and
(b) reads caches of up to `attention.CPU_DECODE_WHOLE_MAX` entries and
`attention.CPU_DECODE_WHOLE_BYTES` of keys and values per layer whole, and
caches of up to `attention.CPU_DECODE_LIVE_BYTES` whole at the steps where
`CPU_DECODE_LIVE_SHARE` of them is live, walking the others block by block up to
the live length. For each model size and
configuration (batch x longest prompt x new tokens; other prompts half to full
length) this script prefills one engine (fp32, fp32 cache) and compiles
`engine.decode_loop` once per kernel on the same state:

  auto      the default;
  dot       scores as one einsum (XLA:CPU: B*K [G, E] x [E, S] matmuls);
  blocks    the block loop for every cache longer than one 256-entry block.

It checks all three give the same greedy tokens, then times `--repeats`
rounds (order alternating each round; this machine's drift cancels in the
paired difference) and prints ms per step and the median paired change of
`auto` against each of the others.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from absl import app, flags

from experiments.benchmarks.common import model_config, uneven_prompts

_MODELS = flags.DEFINE_list("models", ["tiny", "50m"], "Model sizes: tiny, 50m.")
_CONFIGS = flags.DEFINE_list("configs", ["8x64x128", "8x512x128", "8x64x512", "32x64x128"],
                             "batch x prompt x new tokens.")
_REPEATS = flags.DEFINE_integer("repeats", 4, "Timed rounds.")
# `ModelConfig.decode_attention` names; the default first.
VARIANTS = ("auto", "dot", "blocks")


def _parse(config: str) -> tuple[int, int, int]:
  try:
    B, P, N = (int(x) for x in config.split("x"))
  except ValueError:
    raise app.UsageError(f"--configs: {config!r} is not batch x prompt x new, e.g. 8x64x128.")
  return B, P, N


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import engine as engine_lib  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  configs = [_parse(c) for c in _CONFIGS.value]
  for size in _MODELS.value:
    cfg = model_config(size)
    params = init_params(jax.random.key(0), cfg)
    rule = SamplingConfig(temperature=0.0, eos_id=-1, pad_id=cfg.vocab_size - 1)
    for B, P, N in configs:
      prompts = uneven_prompts(B, P, cfg.vocab_size, seed=B * P + N)
      eng = engine_lib.Engine(cfg, params, slots=B,
                              max_len=engine_lib.bucket(P) + engine_lib.bucket(N), rule=rule,
                              cache_dtype="float32")
      eng.extend(dict(enumerate(prompts)), {b: jax.random.key(b) for b in range(B)})
      state = eng.state
      active, budget = np.ones(B, bool), np.full(B, N, np.int32)
      fns = {}
      for name in VARIANTS:
        vcfg = dataclasses.replace(cfg, decode_attention=name)
        fns[name] = jax.jit(lambda dp, st, vcfg=vcfg: engine_lib.decode_loop(
            dp, st, active, budget, np.bool_(False), cfg=vcfg,
            rule=eng._device_rule,  # pylint: disable=protected-access
            steps=N, feature_major=eng.feature_major)[1])
        jax.block_until_ready(fns[name](eng.decode_params, state))
      tokens = {name: np.asarray(f(eng.decode_params, state)) for name, f in fns.items()}
      same = all((t == tokens["auto"]).all() for t in tokens.values())
      times = {name: [] for name in VARIANTS}
      for r in range(_REPEATS.value):
        for name in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
          t0 = time.perf_counter()
          jax.block_until_ready(fns[name](eng.decode_params, state))
          times[name].append((time.perf_counter() - t0) / N * 1e3)
      ms = {name: statistics.median(t) for name, t in times.items()}
      change = {name: statistics.median(o - x for o, x in zip(times["auto"], times[name]))
                for name in VARIANTS[1:]}
      print(f"{size:5s} batch {B:3d} prompt {P:4d} new {N:4d} cache {eng.cache_len:5d}: "
            f"auto {ms['auto']:7.2f}  dot {ms['dot']:7.2f}  blocks {ms['blocks']:7.2f} ms/step  "
            f"auto-dot {change['dot']:+6.2f}  auto-blocks {change['blocks']:+6.2f} ms  "
            f"same tokens {same}", flush=True)


if __name__ == "__main__":
  app.run(main)
