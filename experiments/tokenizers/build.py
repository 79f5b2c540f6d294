r"""Builds the tiny configs' BPE tokenizer (a Qwen3-style byte-level BPE, 4,096 ids).

  python -m experiments.tokenizers.build [--out=experiments/tokenizers/tiny_bpe_4k]

Trained offline on what a tiny run reads and writes: the rendered designer and hint
prompts of both settings, the agent prompts, the built-in env programs and the
interpreter's bundled documentation (the embedded corpus). The result is committed, so every
machine (whatever its Python version, whose documentation differs) uses the same ids.
"""

import itertools
import os

from absl import app
from absl import flags

_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "tiny_bpe_4k"),
                           "Output directory.")
_VOCAB = flags.DEFINE_integer("vocab_size", 4096, "Ids in all, added tokens included.")
_DOCS = flags.DEFINE_integer("max_documents", 400, "Corpus documents to train on.")


def training_texts(max_documents: int) -> list[str]:
  """The texts the tokenizer is trained on, in a fixed order."""
  from spade_jax import designer, envs  # pylint: disable=g-import-not-at-top
  from spade_jax.designer import prompts, stdlib_docs  # pylint: disable=g-import-not-at-top
  programs = list(envs.builtin_programs().values())
  texts = [prompts.render_all()] * 4 + programs * 2
  for setting in envs.SETTINGS:
    texts.append(designer.agent_system_prompt(setting))
    texts += [designer.hint_prompt(p, setting) for p in programs]
  docs = itertools.islice(stdlib_docs.iter_stdlib_documents(), max_documents)
  return texts + [text for _, text in docs]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from spade_jax.models.tokenizer import train_bpe  # pylint: disable=g-import-not-at-top
  tok = train_bpe(training_texts(_DOCS.value), _VOCAB.value, _OUT.value)
  print(f"wrote {_OUT.value}: {tok.vocab_size} ids, eos {tok.eos_id}, pad {tok.pad_id}")


if __name__ == "__main__":
  app.run(main)
