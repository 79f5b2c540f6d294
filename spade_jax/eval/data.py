"""Local benchmark files: finding them and reading JSON lines with errors that say the fix."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Sequence


def find_files(suite: str, path: str, data_dir: str, default: str, what: str) -> list[str]:
  """The JSONL files a suite reads.

  Args:
    suite: suite name, for messages.
    path: the suite's ``path`` setting: a file, a directory (its ``*.jsonl``) or a glob;
      "" uses ``default`` under ``data_dir``.
    data_dir: directory of the local benchmark files.
    default: glob of the suite's files under ``data_dir`` (e.g. "aime*.jsonl").
    what: what the files hold and where they come from, for messages.

  Returns:
    Sorted file paths (at least one).
  """
  fix = (f"Put them there, or point the suite at them: --data_dir=DIR (eval.data_dir) or "
         f"--set={suite}.path=FILE (eval.overrides['{suite}']['path']).")
  if not path:
    if not data_dir:
      raise FileNotFoundError(f"Suite {suite!r} reads local files ({what}) and no data "
                              f"directory is set: expected {default} under it. {fix}")
    path = os.path.join(data_dir, default)
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "*.jsonl")))
  elif any(c in path for c in "*?["):
    files = sorted(glob.glob(path))
  else:
    files = [path] if os.path.isfile(path) else []
  if not files:
    raise FileNotFoundError(f"Suite {suite!r}: no file matches {path!r} ({what}). {fix}")
  return files


def read_jsonl(path: str, suite: str, required: Sequence[Sequence[str]], fmt: str
               ) -> list[dict[str, Any]]:
  """Rows of a JSON-lines file, each checked for its fields.

  Args:
    path: the file.
    suite: suite name, for messages.
    required: per required field, the accepted spellings (one of them must be present).
    fmt: the expected format, for messages.

  Returns:
    One dict per non-blank line.
  """
  rows = []
  try:
    f = open(path, encoding="utf-8")  # pylint: disable=consider-using-with
  except OSError as e:
    raise FileNotFoundError(f"Suite {suite!r} cannot read {path!r}: {e.strerror}. Check the "
                            "path and its permissions.") from e
  with f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}). Suite {suite!r} expects "
                         f"one JSON object per line: {fmt}. Fix or remove that line.") from e
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{n}: a JSON {type(row).__name__}, not an object. Suite "
                         f"{suite!r} expects one JSON object per line: {fmt}.")
      for names in required:
        if not any(k in row for k in names):
          raise ValueError(f"{path}:{n}: missing field {' or '.join(map(repr, names))} "
                           f"(has {sorted(row)}). Suite {suite!r} expects: {fmt}.")
      rows.append(row)
  if not rows:
    raise ValueError(f"{path} holds no rows. Suite {suite!r} expects: {fmt}.")
  return rows


def field(row: dict[str, Any], names: Sequence[str], default: Any = None) -> Any:
  """The first of ``names`` present in ``row``."""
  for k in names:
    if k in row:
      return row[k]
  return default
