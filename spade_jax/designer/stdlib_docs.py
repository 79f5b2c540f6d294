"""Offline default corpus: documentation text that ships with the Python interpreter.

The documents are read from the running interpreter's standard library, so building the
dataset needs no network and no files outside the Python installation:

* ``pydoc_topics/<name>``: the language-reference topics bundled in ``pydoc_data.topics``
  (the text ``help("for")`` prints);
* ``stdlib/<module>``: the docstrings of a standard-library module and of its public
  top-level classes and functions, read with ``ast`` (modules are never imported);
* ``license/python``: the interpreter's ``LICENSE.txt``.

All of it is distributed with CPython under the PSF License Agreement; see
``third_party/README.md``. Importing this module imports ``tensorflow_datasets``; the rest
of ``spade_jax.designer`` imports it lazily.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import os
import sys
import sysconfig
import tempfile
from collections.abc import Iterator

from etils import epath
import tensorflow_datasets as tfds

# Stdlib folders that hold tests, demos, GUI code or vendored tools rather than prose.
_SKIP_DIRS = frozenset({
    "test", "tests", "idlelib", "turtledemo", "tkinter", "lib2to3", "ensurepip",
    "site-packages", "dist-packages", "config", "__phello__", "__pycache__",
    "lib-dynload", "pydoc_data", "encodings", "venv",
})
_MIN_WORDS = 40
# Very large modules add parse time and little prose beyond their first docstrings.
_MAX_SOURCE_BYTES = 200_000


def _docstring_text(source: str, module: str) -> str | None:
  """Module docstring plus public top-level class/function docstrings, or None."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return None
  parts = []
  doc = ast.get_docstring(tree)
  if doc:
    parts.append(doc.strip())
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      if node.name.startswith("_"):
        continue
      node_doc = ast.get_docstring(node)
      if node_doc:
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        parts.append(f"{kind} {module}.{node.name}: {node_doc.strip()}")
  text = "\n\n".join(parts)
  if len(text.split()) < _MIN_WORDS:
    return None
  return f"Python module {module}\n\n{text}"


def _module_files(stdlib: str) -> Iterator[tuple[str, str]]:
  """(module name, path) for public top-level stdlib modules and packages."""
  for name in sorted(os.listdir(stdlib)):
    path = os.path.join(stdlib, name)
    if name.startswith("_") or name in _SKIP_DIRS:
      continue
    if name.endswith(".py"):
      module = name[:-3]
    elif os.path.isfile(os.path.join(path, "__init__.py")):
      module, path = name, os.path.join(path, "__init__.py")
    else:
      continue
    if os.path.getsize(path) <= _MAX_SOURCE_BYTES:
      yield module, path


def iter_stdlib_documents() -> Iterator[tuple[str, str]]:
  """Yields ``(doc_id, text)`` for the offline corpus, in a fixed order.

  Returns:
    An iterator over pairs; ids are unique.
  """
  stdlib = sysconfig.get_paths()["stdlib"]
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
    for name in sorted(topics.topics):
      text = topics.topics[name].strip()
      if len(text.split()) >= _MIN_WORDS:
        yield f"pydoc_topics/{name}", f"Python language reference: {name}\n\n{text}"
  except ImportError:
    pass
  if os.path.isdir(stdlib):
    for module, path in _module_files(stdlib):
      try:
        with open(path, encoding="utf-8") as f:
          source = f.read()
      except (OSError, UnicodeDecodeError):
        continue
      text = _docstring_text(source, module)
      if text:
        yield f"stdlib/{module}", text
    license_path = os.path.join(stdlib, "LICENSE.txt")
    if os.path.exists(license_path):
      with open(license_path, encoding="utf-8", errors="replace") as f:
        yield "license/python", f.read().strip()


def config_name() -> str:
  """Builder config for the running interpreter, e.g. ``py311``: text differs by version."""
  return f"py{sys.version_info.major}{sys.version_info.minor}"


class SpadeStdlibDocs(tfds.core.GeneratorBasedBuilder):
  """Documentation shipped with the running Python, as a one-split text dataset."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "pydoc topics, stdlib docstrings and the Python license."}
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(
      name=config_name(), description="Documents from the running interpreter.")]

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # Points tfds at this file directly. The inherited lookup needs the
    # ``importlib_resources`` backport, which the pinned stack does not install.
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="Offline grounding documents for the environment designer.",
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "text": tfds.features.Text(),
        }),
        homepage="https://docs.python.org/3/",
        license="PSF-2.0",
    )

  def _split_generators(self, dl_manager):  # pylint: disable=unused-argument
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for doc_id, text in iter_stdlib_documents():
      yield doc_id, {"id": doc_id, "text": text}


def build(data_dir: str) -> SpadeStdlibDocs:
  """Builds (or reuses) the offline dataset under ``data_dir``; no network is touched.

  Args:
    data_dir: tfds data directory, e.g. ``<workdir>/tfds``.

  Returns:
    The prepared builder (``array_record`` format, random access via ``as_data_source``).
  """
  with tfds_tempdirs_removed():
    builder = SpadeStdlibDocs(data_dir=data_dir, config=config_name(),
                              file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP))
  return builder


@contextlib.contextmanager
def tfds_tempdirs_removed():
  """Removes the empty `<tmp>/tmp*tfds` folders that appear meanwhile.

  A tfds builder whose info it cannot read from its data directory asks GCS for metadata
  into a fresh `tempfile.mkdtemp("tfds")` and leaves it behind, empty, when there is none
  (each new run's embedded corpus and each `tfds` source opened did). Only empty folders
  that were not there before are removed, so another process's folder is never touched.
  """
  pattern = os.path.join(tempfile.gettempdir(), "tmp*tfds")
  before = set(glob.glob(pattern))
  try:
    yield
  finally:
    for path in set(glob.glob(pattern)) - before:
      with contextlib.suppress(OSError):  # not empty, or gone already
        os.rmdir(path)
