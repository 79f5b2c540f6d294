r"""Decode tokens/s and achieved memory bandwidth on one accelerator.

  python -m experiments.benchmarks.gpu_decode [--batch=64] [--prompt=512] [--new=512] \
      [--decode_attention=auto,whole]
  python -m experiments.benchmarks.gpu_decode --smoke      # tiny model, CPU, seconds

A random Qwen3-1.7B-shaped model (bf16 parameters, compute and KV cache) on
one device. The prompt is prefilled once (`Engine.extend`), then `--new`
greedy tokens are decoded for every row (`Engine.decode`, one while loop);
decode time excludes compilation (a warm-up round runs first). Bandwidth is
the bytes one decode step must read (all parameters plus every row's KV cache
over the blocks the step attends over: the live prefix rounded up to the
decode attention's block; the whole cache for "whole") times steps over decode
time. One row per `--decode_attention` kernel, each checked to emit the first
kernel's greedy tokens. Writes the rows to `gpu_decode.json` in $OUT (or --out)
and prints them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from absl import app, flags

_BATCH = flags.DEFINE_integer("batch", 64, "Rows decoded together.")
_PROMPT = flags.DEFINE_integer("prompt", 512, "Prompt tokens per row.")
_NEW = flags.DEFINE_integer("new", 512, "New tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds (median reported).")
_KERNELS = flags.DEFINE_list("decode_attention", ["auto", "whole"],
                             "Decode attention kernels to time (model.decode_attention names).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny model and sizes; runs on CPU.")
_OUT = flags.DEFINE_string("out", "", "Output directory (default $OUT or the cwd).")


def model_config(smoke: bool):
  from spade_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  if smoke:
    return ModelConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, mlp_dim=128, param_dtype="bfloat16",
                       compute_dtype="bfloat16")
  # Qwen3-1.7B shapes.
  return ModelConfig(vocab_size=151936, d_model=2048, num_layers=28, num_heads=16,
                     num_kv_heads=8, head_dim=128, mlp_dim=6144, tie_embeddings=True,
                     param_dtype="bfloat16", compute_dtype="bfloat16")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from spade_jax.models import init_params, num_params  # pylint: disable=g-import-not-at-top
  from spade_jax.models.attention import live_block  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Engine, SamplingConfig  # pylint: disable=g-import-not-at-top

  smoke = _SMOKE.value
  if smoke:
    jax.config.update("jax_platforms", "cpu")
  batch, plen, new = (4, 16, 16) if smoke else (_BATCH.value, _PROMPT.value, _NEW.value)
  cfg = model_config(smoke)
  params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), cfg)
  n_params = int(num_params(cfg))
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  rng = np.random.default_rng(0)
  prompts = {i: rng.integers(3, cfg.vocab_size, plen).tolist() for i in range(batch)}

  def one_round(c):
    eng = Engine(c, params, slots=batch, max_len=plen + new, rule=rule)
    t0 = time.perf_counter()
    eng.extend(prompts, {i: jax.random.key(i) for i in range(batch)})
    jax.block_until_ready(eng.state.logits)
    t1 = time.perf_counter()
    out = eng.decode({i: new for i in range(batch)})
    t2 = time.perf_counter()
    assert all(len(out[i][0]) == new for i in range(batch))
    return t1 - t0, t2 - t1, eng, [list(out[i][0]) for i in range(batch)]

  results, first_tokens = [], None
  for name in _KERNELS.value:
    c = dataclasses.replace(cfg, decode_attention=name)  # checks the name
    one_round(c)  # compile
    rounds = [one_round(c) for _ in range(_REPEATS.value)]
    prefill, decode, eng, tokens = sorted(rounds, key=lambda r: r[1])[len(rounds) // 2]
    first_tokens = tokens if first_tokens is None else first_tokens
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(eng.state.cache))
    # Decode step i reads the blocks before the longest row's end ptr0 + i + 1.
    blk = eng.cache_len if name == "whole" else live_block(eng.cache_len)
    ptr0 = int(eng.lengths.max()) - new
    read = np.mean([-(-(ptr0 + i + 1) // blk) * blk for i in range(new)]) / eng.cache_len
    step_bytes = param_bytes + cache_bytes * read
    results.append(dict(
        device=str(jax.devices()[0].device_kind), smoke=smoke, decode_attention=name,
        batch=batch, prompt=plen, new=new, params=n_params, param_bytes=param_bytes,
        cache_bytes=cache_bytes, cache_fraction_read=float(read),
        cache_len=eng.cache_len, prefill_s=prefill, decode_s=decode,
        decode_tokens_per_s=batch * new / decode, decode_steps_per_s=new / decode,
        step_ms=1e3 * decode / new,
        achieved_bandwidth_gb_s=step_bytes * new / decode / 1e9,
        prefill_tokens_per_s=batch * plen / prefill,
        same_tokens_as_first=tokens == first_tokens))
  text = json.dumps(results, indent=1)
  print(text)
  out = _OUT.value or os.environ.get("OUT") or "."
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "gpu_decode.json"), "w") as f:
    f.write(text)


if __name__ == "__main__":
  app.run(main)
