r"""Converts between Hugging Face checkpoints and our orbax model checkpoints.

  python -m launch.convert --hf_in=/path/Qwen3-4B --out=/tmp/q3_4b
  python -m launch.convert --ckpt_in=/tmp/q3_4b --hf_out=/tmp/q3_4b_hf

Tokenizer files travel with the weights in both directions.
"""

from absl import app
from absl import flags

_HF_IN = flags.DEFINE_string("hf_in", None, "HF checkpoint directory to import.")
_OUT = flags.DEFINE_string("out", None, "Output directory of the orbax checkpoint.")
_CKPT_IN = flags.DEFINE_string("ckpt_in", None, "Orbax model checkpoint to export.")
_HF_OUT = flags.DEFINE_string("hf_out", None, "Output directory of the HF checkpoint.")
_DTYPE = flags.DEFINE_string("param_dtype", None,
                             "Parameter dtype to store (default: the source's).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  if _HF_IN.value and _OUT.value:
    overrides = {"param_dtype": _DTYPE.value} if _DTYPE.value else {}
    if not overrides:
      hf = models.read_hf_config(_HF_IN.value)
      dt = hf.get("dtype") or hf.get("torch_dtype")
      if dt in ("float32", "bfloat16", "float16"):
        overrides = {"param_dtype": dt}
    params, cfg = models.load_hf(_HF_IN.value, **overrides)
    models.save_model(_OUT.value, params, cfg, models.read_hf_config(_HF_IN.value))
    models.copy_tokenizer_files(_HF_IN.value, _OUT.value)
    print(f"Wrote {_OUT.value} ({models.num_params(cfg):,} parameters)")
  elif _CKPT_IN.value and _HF_OUT.value:
    params, cfg, hf = models.load_model(_CKPT_IN.value)
    models.save_hf(_HF_OUT.value, params, cfg, base_config=hf, dtype=_DTYPE.value)
    models.copy_tokenizer_files(_CKPT_IN.value, _HF_OUT.value)
    print(f"Wrote {_HF_OUT.value}")
  else:
    raise app.UsageError("Pass either --hf_in and --out, or --ckpt_in and --hf_out.")


if __name__ == "__main__":
  app.run(main)
