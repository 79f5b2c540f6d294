r"""Generates a continuation with a Hugging Face, converted or GGUF checkpoint.

  python -m launch.generate --hf_checkpoint=/path/Qwen3-0.6B --prompt="Hello" \
      --max_new_tokens=32 --temperature=0
  python -m launch.generate --ckpt=/tmp/q3_06b --prompt_ids=1,2,3 --chat=false
  python -m launch.generate --init_from=gguf:smollm2_135m_instruct --prompt="Hi" --chat \
      --thinking=false   # also gguf:FILE, hf:DIR, orbax:DIR

Prints one JSON object: {"prompt_ids", "ids", "text" (with a tokenizer)}.
"""

import json

from absl import app
from absl import flags

from spade_jax import console

_HF = flags.DEFINE_string("hf_checkpoint", None, "HF checkpoint directory.")
_CKPT = flags.DEFINE_string("ckpt", None, "Model checkpoint written by launch.convert.")
_INIT_FROM = flags.DEFINE_string("init_from", None, "gguf:FILE (or gguf:PRESET), hf:DIR or "
                                 "orbax:DIR, as model.init_from.")
_PROMPT = flags.DEFINE_string("prompt", None, "Prompt text (needs tokenizer.json).")
_PROMPT_IDS = flags.DEFINE_list("prompt_ids", None, "Comma-separated prompt token ids.")
_CHAT = flags.DEFINE_bool("chat", False, "Wrap --prompt as a Qwen3 chat user turn.")
_THINKING = flags.DEFINE_bool("thinking", True, "Qwen3 thinking mode with --chat.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k (0 disables).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_COMPUTE = flags.DEFINE_string("compute_dtype", None, "Override the compute dtype.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if sum(bool(v) for v in (_HF.value, _CKPT.value, _INIT_FROM.value)) != 1:
    raise app.UsageError("Pass exactly one of --hf_checkpoint, --ckpt and --init_from.")
  if bool(_PROMPT.value is not None) == bool(_PROMPT_IDS.value):
    raise app.UsageError("Pass exactly one of --prompt and --prompt_ids.")
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import models, sampling  # pylint: disable=g-import-not-at-top
  if _INIT_FROM.value:
    source, flag = _INIT_FROM.value, "--init_from"
  elif _HF.value:
    source, flag = f"hf:{_HF.value}", "--hf_checkpoint"
  else:
    source, flag = f"orbax:{_CKPT.value}", "--ckpt"
  params, cfg, hf, directory = models.load_checkpoint(source, field=flag)
  if _COMPUTE.value:
    cfg = dataclasses.replace(cfg, compute_dtype=_COMPUTE.value)
  tok = models.load_tokenizer(directory)
  if _PROMPT_IDS.value:
    ids = [int(i) for i in _PROMPT_IDS.value]
  else:
    if tok is None:
      raise app.UsageError(f"--prompt needs {directory}/tokenizer.json; pass "
                           "--prompt_ids instead.")
    ids = (models.ChatTemplate(tok, thinking=_THINKING.value).prompt(None, _PROMPT.value)
           if _CHAT.value else tok.encode(_PROMPT.value))
  eos = tok.eos_id if tok is not None else (hf or {}).get("eos_token_id")
  eos = eos[0] if isinstance(eos, list) else eos
  pad = tok.pad_id if tok is not None else 0
  rule = sampling.SamplingConfig(temperature=_TEMP.value, top_p=_TOP_P.value,
                                 top_k=_TOP_K.value, eos_id=-1 if eos is None else eos,
                                 pad_id=pad)
  gen = sampling.generate(params, cfg, [ids], rule, jax.random.key(_SEED.value),
                          _MAX_NEW.value)
  out = {"prompt_ids": ids, "ids": gen.tokens[0]}
  if tok is not None:
    out["text"] = tok.decode(gen.tokens[0])
  print(json.dumps(out))


if __name__ == "__main__":
  console.run(main)
