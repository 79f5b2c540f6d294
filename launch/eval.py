r"""Held-out evaluation of a checkpoint (docs/METHOD.md §8): suites from `spade_jax.eval`.

  python -m launch.eval --hf_checkpoint=/ckpt/Qwen3-4B --suites=reasoning_gym,bfcl,humaneval
  python -m launch.eval --init_from=gguf:smollm2_135m_instruct --suites=reasoning_gym \
      --thinking=false   # also gguf:FILE, hf:DIR, orbax:DIR
  python -m launch.eval --workdir=/tmp/spade_jax/tiny [--step=N] --suites=humaneval --limit=5
  python -m launch.eval --hf_checkpoint=DIR --suites=aime,gpqa,livecodebench \
      --data_dir=/data/benchmarks --json > report.json
  python -m launch.eval ... --set=bfcl.categories=base,miss_func --set=aime.samples=8

Each suite samples as the paper did (its config defaults); --limit / --samples /
--max_new_tokens / --batch_size shrink every suite, --set=SUITE.FIELD=VALUE sets one field.
Prints one line per score (with --json: the whole report, per-item records included);
progress lines go to stderr. --report=PATH writes the report there (with --workdir the
default is <workdir>/eval/step_<N>.json).
"""

import ast
import dataclasses
import json
import sys

from absl import app
from absl import flags

from spade_jax import console

_HF = flags.DEFINE_string("hf_checkpoint", None,
                          "Hugging Face checkpoint directory (config.json, safetensors, "
                          "tokenizer.json).")
_CKPT = flags.DEFINE_string("ckpt", None, "Model checkpoint written by launch.convert / "
                            "launch.export --orbax_out (with tokenizer.json).")
_INIT_FROM = flags.DEFINE_string("init_from", None, "gguf:FILE (or gguf:PRESET), hf:DIR or "
                                 "orbax:DIR, as model.init_from.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (its config.json and "
                               "checkpoints).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --workdir (default: latest).")
_SUITES = flags.DEFINE_list("suites", ["reasoning_gym", "bfcl", "humaneval"],
                            "Suites to run (spade_jax.eval.SUITES).")
_LIMIT = flags.DEFINE_integer("limit", 0, "Items per suite at most (0: the suite's default).")
_SAMPLES = flags.DEFINE_integer("samples", 0, "Samples per item (0: the suite's default).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 0, "Tokens per completion or turn (0: the "
                                "suite's default).")
_BATCH = flags.DEFINE_integer("batch_size", 0, "KV-cache rows (0: the suite's default).")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "Directory of the local benchmark files "
                                "(aime*.jsonl, gpqa_diamond*.jsonl, livecodebench*.jsonl).")
_SET = flags.DEFINE_multi_string("set", [], "SUITE.FIELD=VALUE: one suite setting, e.g. "
                                 "bfcl.categories=base,long_context or aime.path=FILE.")
_THINKING = flags.DEFINE_bool("thinking", True, "Qwen3 thinking mode.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_COMPUTE = flags.DEFINE_string("compute_dtype", None, "Override the compute dtype.")
_JSON = flags.DEFINE_bool("json", False, "Print the whole JSON report on stdout.")
_REPORT = flags.DEFINE_string("report", None, "Also write the JSON report to this path.")


def _overrides(items, suites_mod) -> dict:
  """--set items -> {suite: {field: value}}; tuple fields take comma-separated values."""
  out: dict = {}
  for item in items:
    key, eq, raw = item.partition("=")
    suite, dot, name = key.partition(".")
    if not (eq and dot and name):
      raise ValueError(f"--set={item!r}: expected SUITE.FIELD=VALUE, e.g. aime.samples=8.")
    fields = {f.name: f for f in dataclasses.fields(suites_mod.SUITES[suite].config)}
    if name not in fields:
      raise ValueError(f"--set={item!r}: {suite} has no field {name!r}; valid fields: "
                       f"{sorted(fields)}.")
    default = fields[name].default
    if isinstance(default, tuple):
      value = tuple(v for v in raw.split(",") if v)
    elif isinstance(default, str):
      value = raw
    else:
      try:
        value = ast.literal_eval(raw)
      except (ValueError, SyntaxError):
        raise ValueError(f"--set={item!r}: {raw!r} is not a {type(default).__name__}.") from None
    out.setdefault(suite, {})[name] = value
  return out


def _load(models):
  """(params, model config, vocab, description) of the chosen checkpoint."""
  if _WORKDIR.value:
    from spade_jax.selfplay import workdir  # pylint: disable=g-import-not-at-top
    c, vocab, params, step = workdir.load_run(_WORKDIR.value, _STEP.value)
    return params, c.model, vocab, {"workdir": _WORKDIR.value, "step": step}
  if _INIT_FROM.value:
    source, flag, given = _INIT_FROM.value, "--init_from", _INIT_FROM.value
  elif _HF.value:
    source, flag, given = f"hf:{_HF.value}", "--hf_checkpoint", _HF.value
  else:
    source, flag, given = f"orbax:{_CKPT.value}", "--ckpt", _CKPT.value
  params, cfg, _, directory = models.load_checkpoint(source, field=flag)
  vocab = models.load_tokenizer(directory)
  if vocab is None:
    raise FileNotFoundError(f"{flag}={directory!r} has no tokenizer.json; copy the model's "
                            "tokenizer files there (the suites need text).")
  return params, cfg, vocab, {flag[2:]: given}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if sum(bool(v) for v in (_HF.value, _CKPT.value, _INIT_FROM.value, _WORKDIR.value)) != 1:
    raise app.UsageError("Pass exactly one of --hf_checkpoint, --ckpt, --init_from and "
                         "--workdir.")
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax import eval as ev, models, sampling  # pylint: disable=g-import-not-at-top
  from spade_jax.registry import UnknownNameError  # pylint: disable=g-import-not-at-top
  try:
    config = ev.EvalConfig(suites=tuple(_SUITES.value), limit=_LIMIT.value,
                           samples=_SAMPLES.value, max_new_tokens=_MAX_NEW.value,
                           batch_size=_BATCH.value, data_dir=_DATA_DIR.value, seed=_SEED.value,
                           overrides=_overrides(_SET.value, ev))
    cfgs = ev.check_suites(config.suites, config.suite_configs())
  except (FileNotFoundError, ValueError, ImportError, UnknownNameError) as e:
    raise console.BadInput(e) from e
  try:
    params, cfg, vocab, source = _load(models)
  except (FileNotFoundError, ValueError) as e:
    raise console.BadInput(e) from e
  if _COMPUTE.value:
    cfg = dataclasses.replace(cfg, compute_dtype=_COMPUTE.value)
  rule = sampling.SamplingConfig(eos_id=vocab.eos_id, pad_id=vocab.pad_id)
  policy = sampling.Sampler(params, cfg, rule, jax.random.key(_SEED.value),
                            detokenize=vocab.decode)
  chat = models.ChatTemplate(vocab, thinking=_THINKING.value)
  results = ev.evaluate(policy, chat, config.suites, cfgs, progress=ev.line_progress())
  report = {"model": source, "thinking": _THINKING.value,
            "scores": {f"{s}/{k}": v for s, r in results.items() for k, v in r.scores.items()},
            "suites": {s: dataclasses.asdict(r) for s, r in results.items()}}
  path = _REPORT.value
  if path is None and _WORKDIR.value:
    path = f"{_WORKDIR.value.rstrip('/')}/eval/step_{source['step']}.json"
  if path:
    from etils import epath  # pylint: disable=g-import-not-at-top
    out = epath.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"launch.eval: wrote {path}", file=sys.stderr)
  if _JSON.value:
    print(json.dumps(report, default=str))
  else:
    for name, value in report["scores"].items():
      print(f"{name:40s} {value:.4f}")


if __name__ == "__main__":
  console.run(main)
