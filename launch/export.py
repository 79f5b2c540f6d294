r"""Exports a training workdir's weights as a Hugging Face checkpoint.

  python -m launch.export --workdir=/tmp/spade_jax/tiny [--step=N] --hf_out=/tmp/tiny_hf
  python -m launch.export --workdir=DIR --orbax_out=DIR2   # a model checkpoint for init_from

The Hugging Face directory holds config.json, model.safetensors and the run's tokenizer
files; `transformers` loads it as Qwen3ForCausalLM / Qwen3MoeForCausalLM, or
LlamaForCausalLM for a model without q/k norm (e.g. one started from a GGUF file).
"""

from absl import app
from absl import flags

from spade_jax import console

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (local or gs://).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_HF_OUT = flags.DEFINE_string("hf_out", None, "Output directory of the HF checkpoint.")
_ORBAX_OUT = flags.DEFINE_string("orbax_out", None, "Output directory of a model checkpoint.")
_DTYPE = flags.DEFINE_string("dtype", None, "Stored dtype (default: the run's param dtype).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value or not (_HF_OUT.value or _ORBAX_OUT.value):
    raise app.UsageError("Pass --workdir and --hf_out (or --orbax_out).")
  import os  # pylint: disable=g-import-not-at-top
  from spade_jax import models  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build, workdir  # pylint: disable=g-import-not-at-top
  c, _, params, step = workdir.load_run(_WORKDIR.value, _STEP.value)
  kind, src = build.parse_init_from(c.init_from)
  base = models.read_hf_config(src) if kind == "hf" and os.path.isdir(src) else None
  tok_dir = c.tokenizer if c.tokenizer != "byte" else None
  if tok_dir and os.path.isfile(tok_dir):
    tok_dir = os.path.dirname(tok_dir)
  if _HF_OUT.value:
    models.save_hf(_HF_OUT.value, params, c.model, base_config=base, dtype=_DTYPE.value)
    if tok_dir:
      models.copy_tokenizer_files(tok_dir, _HF_OUT.value)
    print(f"Wrote {_HF_OUT.value} from step {step} of {_WORKDIR.value}")
  if _ORBAX_OUT.value:
    models.save_model(_ORBAX_OUT.value, params, c.model, base)
    if tok_dir:
      models.copy_tokenizer_files(tok_dir, _ORBAX_OUT.value)
    print(f"Wrote {_ORBAX_OUT.value} from step {step} of {_WORKDIR.value}")


if __name__ == "__main__":
  console.run(main)
