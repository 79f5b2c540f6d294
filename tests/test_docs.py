"""The documents stay true: citations resolve, named files exist, budgets hold.

The code cites the method as ``docs/METHOD.md §n`` (or ``§n.m``; lists such as ``§6-§7`` and
``§1, §6`` cite each number). Every cited number must be a heading of ``docs/METHOD.md``;
every file (and ``path:Name``) that METHOD.md names must exist; no code or project document
cites the design notes that are not in the repository (``REFERENCE``); and the three long
documents keep to their line budgets.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "METHOD.md"
# Where citations are read: code and the documents that sit beside it.
CITING_DIRS = ("spade_jax", "launch", "experiments", "tests")
CITING_FILES = ("WORKSPACE.md", "README.md")
BUDGETS = {"WORKSPACE.md": 300, "docs/METHOD.md": 400, "experiments/benchmarks/RESULTS.md": 340}

HEADING = re.compile(r"^#{2,4} §(\d+(?:\.\d+)?)\b", re.M)
# A citation and the run of section numbers after it ("§6-§7", "§1, §6", "§1.8 and §2").
CITATION = re.compile(r"docs/METHOD\.md\s+(§\d+(?:\.\d+)?(?:\s*(?:-|,|and|or)\s*§\d+(?:\.\d+)?)*)")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
# The old spellings: the notes' name, with or without ".md", followed by "§5", "section 3"
# or "1.8", or the file name anywhere (a path to it included); not an identifier such as
# `Role.<name>`. The test strings below build the name from parts, so a rewrite of the
# old spellings over the repository leaves this file as it is.
OLD_CITATION = re.compile(r"(?<![\w.])REFERENCE(?:\.md)?\s+(?:§|section\b|\d)|REFERENCE\.md")
# A repository path inside backticks, optionally followed by ":Name" or ":Class.name".
PATH_REF = re.compile(r"`((?:spade_jax|launch|experiments|tests|docs|third_party)/[\w./-]*"
                      r"|WORKSPACE\.md|README\.md)(?::([\w.]+))?`")


def _citing_files() -> list[pathlib.Path]:
  out = [ROOT / f for f in CITING_FILES if (ROOT / f).exists()]
  for d in CITING_DIRS:
    for path in sorted((ROOT / d).rglob("*")):
      if path.suffix in (".py", ".md") and "__pycache__" not in path.parts:
        out.append(path)
  return out


def _headings(text: str) -> list[str]:
  return HEADING.findall(text)


def cited_sections(text: str) -> list[str]:
  """Every section number cited as ``docs/METHOD.md §...`` in ``text``."""
  return [n for run in CITATION.findall(text) for n in SECTION.findall(run)]


def old_citations(text: str) -> list[str]:
  """Lines of ``text`` that still cite the notes outside the repository."""
  return [line.strip() for line in text.splitlines() if OLD_CITATION.search(line)]


def defined_names(path: pathlib.Path) -> set[str]:
  """Top-level functions, classes and assigned names of a module, and ``Class.member``."""
  tree = ast.parse(path.read_text())
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
      if isinstance(node, ast.ClassDef):
        for member in node.body:
          if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(f"{node.name}.{member.name}")
          elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
            names.add(f"{node.name}.{member.target.id}")
    elif isinstance(node, ast.Assign):
      names.update(f"{t.id}" for t in node.targets if isinstance(t, ast.Name))
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      names.add(node.target.id)
  return names


def unresolved_refs(text: str, root: pathlib.Path = ROOT) -> list[str]:
  """The ``path`` and ``path:Name`` references in ``text`` that do not exist under root."""
  bad = []
  for path, name in PATH_REF.findall(text):
    target = root / path.rstrip("/")
    if not target.exists():
      bad.append(f"{path}: no such file or directory")
    elif name:
      if target.suffix != ".py":
        bad.append(f"{path}:{name}: names are looked up in .py files only")
      elif name not in defined_names(target):
        bad.append(f"{path}:{name}: {name} is not defined in {path}")
  return bad


# -- the checks' own behaviour ------------------------------------------------------

def test_citation_pattern_reads_lists_and_ignores_other_text():
  text = ("docs/METHOD.md §1.8: w = ...; docs/METHOD.md §6-§7 and docs/METHOD.md §1, §6; "
          "DESIGN section 3; a §4 alone is not a citation.")
  assert cited_sections(text) == ["1.8", "6", "7", "1", "6"]


def test_old_spellings_are_found_but_not_identifiers():
  r = "REFER" + "ENCE"
  for line in (f"({r} §5)", f"{r}.md section 1.8:", f"# {r}.md 1.8: min(",
               f"written from ../shared/{r}.md §2 alone", f"{r} §6-§7: the"):
    assert old_citations(line), line
  assert not old_citations(f"role_to_mesh={{rlc.Role.ACTOR: mesh, rlc.Role.{r}: mesh}}")
  assert not old_citations("see docs/METHOD.md §5")


def test_refs_are_checked_against_files_and_names(tmp_path):
  (tmp_path / "spade_jax").mkdir()
  (tmp_path / "spade_jax" / "m.py").write_text(
      "X = 1\nclass A:\n  def f(self):\n    pass\ndef g():\n  pass\n")
  ok = "`spade_jax/m.py`, `spade_jax/m.py:X`, `spade_jax/m.py:A.f`, `spade_jax/m.py:g`"
  assert unresolved_refs(ok, tmp_path) == []
  bad = unresolved_refs("`spade_jax/m.py:h` and `spade_jax/gone.py` and `spade_jax/m.py:A.g`",
                        tmp_path)
  assert len(bad) == 3 and "h is not defined" in bad[0] and "no such file" in bad[1]


# -- the repository -----------------------------------------------------------------

def test_method_has_each_section_once():
  heads = _headings(METHOD.read_text())
  assert len(heads) == len(set(heads)), f"duplicate section headings: {heads}"
  for n in range(1, 10):
    assert str(n) in heads, f"docs/METHOD.md has no heading '## §{n} ...'"


def test_every_citation_resolves_to_a_heading():
  heads = set(_headings(METHOD.read_text()))
  missing = []
  for path in _citing_files():
    for n in cited_sections(path.read_text(errors="replace")):
      if n not in heads:
        missing.append(f"{path.relative_to(ROOT)}: docs/METHOD.md §{n}")
  assert not missing, "citations with no heading in docs/METHOD.md:\n" + "\n".join(missing)


def test_no_file_cites_the_notes_outside_the_repository():
  found = []
  for path in _citing_files():
    if path == pathlib.Path(__file__):
      continue
    found += [f"{path.relative_to(ROOT)}: {line}"
              for line in old_citations(path.read_text(errors="replace"))]
  assert not found, ("cite docs/METHOD.md §n instead of the REFERENCE notes (not in the "
                     "repository):\n" + "\n".join(found))


def test_every_path_and_name_in_method_exists():
  bad = unresolved_refs(METHOD.read_text())
  assert not bad, "docs/METHOD.md names what does not exist:\n" + "\n".join(bad)


def test_method_names_code_for_every_section():
  text = METHOD.read_text()
  parts = re.split(r"^#{2,4} §", text, flags=re.M)[1:]
  bare = [p.split("\n", 1)[0] for p in parts if not PATH_REF.search(p)]
  assert not bare, f"sections of docs/METHOD.md that name no file: {bare}"


@pytest.mark.parametrize("name,limit", sorted(BUDGETS.items()))
def test_line_budgets(name, limit):
  lines = len((ROOT / name).read_text().splitlines())
  assert lines <= limit, f"{name} has {lines} lines; its budget is {limit}"
