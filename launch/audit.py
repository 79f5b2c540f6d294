r"""The contamination audit of a run, or of free texts, against the held-out items.

  python -m launch.audit --workdir=/tmp/spade_jax/tiny [--json] [--examples=5]
  python -m launch.audit --texts=texts.json      # a JSON list of strings

With --workdir: scores the run's designed programs (every record of ``memory.json``,
negatives included) against the index of held-out items (``spade_jax.eval.contamination``,
the suites the run's ``eval`` section holds out), reads the ``audit`` field of its
``designer_samples.jsonl`` records where the run wrote one (``spade_jax.selfplay.audit``)
and the audit metrics of ``metrics.jsonl`` (``audit/checked|flagged|dropped/<kind>``
summed over the iterations, and the mean ``audit/hint/leak_rate``), and reports counts per
kind and suite, the worst examples with their matching item, and the hint leak rate: a table
(with --json, the JSON) on stdout, the JSON also in ``<workdir>/audit.json``.

With --texts: prints a JSON list, one entry per text: ``flagged``, ``suite``, ``item``,
``matches``, ``overlap`` and ``answer`` (the item's answer is in the text too).

A workdir without records, or a bad texts file, is a one-line error and exit status 2.
"""

import json
import os

from absl import app
from absl import flags

from spade_jax import console

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (designer_samples.jsonl, "
                               "memory.json).")
_TEXTS = flags.DEFINE_string("texts", None, "A JSON file holding a list of strings to score.")
_JSON = flags.DEFINE_bool("json", False, "Print the report as JSON instead of a table.")
_EXAMPLES = flags.DEFINE_integer("examples", 5, "Worst examples in the report.")
RECORDS = ("designer_samples.jsonl", "memory.json")


class AuditError(console.BadInput):
  """A problem with the input, reported in one line (exit 2)."""


def _read_jsonl(path: str) -> list[dict]:
  rows = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except ValueError as e:
          raise AuditError(f"{path}:{n} is not valid JSON ({e}).") from e
  return rows


def _nested(flat: dict) -> dict:
  out: dict = {}
  for key, value in flat.items():
    *sections, leaf = key.split(".")
    d = out
    for s in sections:
      d = d.setdefault(s, {})
    d[leaf] = value
  return out


def _auditor(workdir: str):
  """The run's auditor (its `audit` and `eval` sections), checking even where it was off."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.audit import AuditConfig, Auditor  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  config = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      config = _nested(json.load(f))
  config = {k: v for k, v in config.items() if k in ("audit", "eval")}
  auditor = Auditor.from_config(config)
  if auditor.cfg.mode == "off":
    auditor.cfg = dataclasses.replace(auditor.cfg, mode="flag")
  return auditor


def _example(note, source: str, detail: dict) -> dict:
  return {"kind": note["kind"], "source": source, "suite": note.get("suite", ""),
          "item": note.get("item", ""), "matches": note.get("matches", 0),
          "overlap": note.get("overlap", 0.0), "answer": note.get("answer", False),
          "leak": note.get("leak"), "reason": note.get("reason", ""), **detail}


def report(workdir: str, examples: int = 5) -> dict:
  """The audit report of a run (see the module)."""
  if not os.path.isdir(workdir):
    raise AuditError(f"{workdir!r} is not a directory; pass a training workdir.")
  present = [r for r in RECORDS if os.path.exists(os.path.join(workdir, r))]
  if not present:
    raise AuditError(f"{workdir!r} holds no run records (none of {', '.join(RECORDS)}); "
                     "pass the workdir of a designer run (python -m launch.train).")
  auditor = _auditor(workdir)
  counts: dict[str, dict] = {}
  found: list[dict] = []

  def count(kind: str, checked: int, notes: list[dict]) -> None:
    c = counts.setdefault(kind, {"checked": 0, "flagged": 0, "suites": {}})
    c["checked"] += checked
    for n in notes:
      c["flagged"] += 1
      key = n.get("suite") or (f"leak:{n['leak']}" if n.get("leak") else "-")
      c["suites"][key] = c["suites"].get(key, 0) + 1

  memory = os.path.join(workdir, "memory.json")
  programs = 0
  if os.path.exists(memory):
    count("program", 0, [])
    with open(memory, encoding="utf-8") as f:
      try:
        records = json.load(f).get("records", [])
      except (ValueError, AttributeError) as e:
        raise AuditError(f"{memory} is not an environment memory file ({e}).") from e
    for r in records:
      if not r.get("program"):
        continue
      programs += 1
      note = auditor.program(r["program"]).to_dict()
      flagged = [note] if note["suite"] else []
      count("program", 1, flagged)
      found += [_example(n, f"memory.json:{r.get('code_hash', '')[:12]}",
                         {"skill": r.get("skill", ""), "iteration": r.get("iteration"),
                          "verdict": r.get("reason") or "valid"}) for n in flagged]
  samples = {"records": 0, "with_audit": 0, "flagged": 0}
  hints = {"checked": 0, "leaked": 0, "by_leak": {}}
  path = os.path.join(workdir, "designer_samples.jsonl")
  if os.path.exists(path):
    for row in _read_jsonl(path):
      samples["records"] += 1
      audit = row.get("audit")
      if not isinstance(audit, dict):
        continue
      samples["with_audit"] += 1
      samples["flagged"] += bool(audit.get("flagged"))
      notes = audit.get("notes", [])
      for kind, n in (audit.get("checked") or {}).items():
        count(kind, int(n), [x for x in notes if x.get("kind") == kind])
      hints["checked"] += int((audit.get("checked") or {}).get("hint", 0))
      for n in notes:
        if n.get("leak"):
          hints["leaked"] += 1
          hints["by_leak"][n["leak"]] = hints["by_leak"].get(n["leak"], 0) + 1
      where = (f"designer_samples:{row.get('step')}/{row.get('slot')}/"
               f"{row.get('attempt')}")
      found += [_example(n, where, {"skill": row.get("skill", ""),
                                    "iteration": row.get("iteration_written"),
                                    "verdict": row.get("verdict")}) for n in notes]
  hints["leak_rate"] = hints["leaked"] / hints["checked"] if hints["checked"] else None
  rates, logged = [], {"rows": 0, "checked": {}, "flagged": {}, "dropped": {}}
  metrics = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(metrics):
    for r in _read_jsonl(metrics):
      audited = False
      for key, value in r.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "audit" and parts[1] in logged:
          audited = True
          logged[parts[1]][parts[2]] = logged[parts[1]].get(parts[2], 0) + int(value)
      logged["rows"] += audited
      if "audit/hint/leak_rate" in r:
        rates.append(r["audit/hint/leak_rate"])
  hints["metrics_leak_rate"] = sum(rates) / len(rates) if rates else None
  found.sort(key=lambda e: (-bool(e["suite"]), -e["overlap"], -e["matches"]))
  index = auditor.index
  out = {"workdir": workdir, "records": present,
         "index": {"digest": index.digest, "items": index.counts()},
         "programs": programs, "samples": samples, "counts": counts, "hints": hints,
         "metrics": logged, "flagged": sum(c["flagged"] for c in counts.values()),
         "examples": found[:examples]}
  with open(os.path.join(workdir, "audit.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  return out


def table(rep: dict) -> str:
  """The report as a few lines of text."""
  lines = [f"audit of {rep['workdir']} (index {rep['index']['digest']}: "
           + ", ".join(f"{k} {v}" for k, v in rep["index"]["items"].items()) + ")",
           f"{'kind':<12} {'checked':>8} {'flagged':>8}  by suite"]
  for kind, c in sorted(rep["counts"].items()):
    by = ", ".join(f"{k} {v}" for k, v in sorted(c["suites"].items())) or "-"
    lines.append(f"{kind:<12} {c['checked']:>8} {c['flagged']:>8}  {by}")
  h = rep["hints"]
  rate = "-" if h["leak_rate"] is None else f"{h['leak_rate']:.3f}"
  metric = "-" if h["metrics_leak_rate"] is None else f"{h['metrics_leak_rate']:.3f}"
  lines.append(f"hints: {h['leaked']}/{h['checked']} leak (rate {rate}; metrics mean "
               f"{metric}) " + ", ".join(f"{k} {v}" for k, v in sorted(h["by_leak"].items())))
  m = rep["metrics"]
  if m["rows"]:
    lines.append(f"metrics ({m['rows']} iterations): " + ", ".join(
        f"{k} {m['flagged'].get(k, 0)}/{n} flagged" for k, n in sorted(m["checked"].items())))
  s = rep["samples"]
  lines.append(f"designer samples: {s['records']} ({s['with_audit']} audited, "
               f"{s['flagged']} flagged)")
  if rep["examples"]:
    lines.append("worst examples:")
  for e in rep["examples"]:
    match = f"{e['suite']} {e['item']}" if e["suite"] else f"{e['leak']} leak"
    lines.append(f"  {e['kind']:<11} {e['source']:<36} {match}  matches {e['matches']} "
                 f"overlap {e['overlap']:.2f}" + (" +answer" if e["answer"] else ""))
  return "\n".join(lines)


def score_texts(path: str) -> list[dict]:
  """One entry per text of the JSON list in ``path`` (see the module)."""
  try:
    with open(path, encoding="utf-8") as f:
      texts = json.load(f)
  except OSError as e:
    raise AuditError(f"cannot read --texts={path!r}: {e.strerror}.") from e
  except ValueError as e:
    raise AuditError(f"--texts={path!r} is not valid JSON ({e}).") from e
  if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
    raise AuditError(f"--texts={path!r} must hold a JSON list of strings.")
  from spade_jax.eval.contamination import load_index  # pylint: disable=g-import-not-at-top
  index = load_index()
  out = []
  for t in texts:
    m = index.score(t)
    out.append({"flagged": m.flagged, "suite": m.suite, "item": m.item,
                "matches": m.matches, "overlap": round(m.overlap, 4), "answer": m.answer})
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if bool(_WORKDIR.value) == bool(_TEXTS.value):
    raise app.UsageError("Pass exactly one of --workdir and --texts.")
  if _TEXTS.value:
    print(json.dumps(score_texts(_TEXTS.value)))
    return
  rep = report(_WORKDIR.value, _EXAMPLES.value)
  print(json.dumps(rep) if _JSON.value else table(rep))


if __name__ == "__main__":
  console.run(main)
