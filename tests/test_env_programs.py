"""Env program text has one home (``spade_jax/envs/programs``), one loader, one name each."""

import ast
import json
import pathlib
import re

import pytest

from spade_jax import envs
from spade_jax.envs import programs
from spade_jax.envs.families import FAMILIES
from spade_jax.envs.program import env_class_name
from spade_jax.registry import UnknownNameError
from spade_jax.selfplay import baselines

PACKAGE = pathlib.Path(programs.__file__).resolve().parents[2]  # spade_jax/
HOME = pathlib.Path(programs.__file__).resolve().parent
# A line that starts an env class: what marks a string as env program text.
ENV_CLASS = re.compile(r"^[ \t]*class \w*Env\b[^\n]*:", re.M)
# String literals that may still hold env program text: the sandbox's isolation probe, which
# reports what a confined worker can reach and is part of the sandbox, not of the envs.
ALLOWED = {("sandbox/isolation.py", "PROBE_SOURCE")}


def _files():
  return sorted(p for p in HOME.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                and p != HOME / "__init__.py")


def test_every_file_is_a_named_program_and_names_are_unique():
  files = _files()
  stems = [p.stem for p in files]
  assert len(stems) == len(set(stems)), sorted(s for s in stems if stems.count(s) > 1)
  assert all(p.suffix == ".py" and p.parent.parent == HOME for p in files), files
  assert {p.parent.name for p in files} == set(programs.KINDS)
  assert sorted(programs.program_names()) == sorted(stems)
  for kind in programs.KINDS:
    assert sorted(programs.program_names(kind)) == sorted(
        p.stem for p in files if p.parent.name == kind)


@pytest.mark.parametrize("name", programs.program_names())
def test_every_program_loads_and_parses(name):
  text = programs.load_program(name)
  assert text.endswith("\n") and not text.startswith("\n"), name
  assert text == (HOME / programs.program_kind(name) / f"{name}.py").read_text(encoding="utf-8")
  tree = ast.parse(text)  # every file is whole Python: no placeholders left to fill
  kind = programs.program_kind(name)
  if kind in ("builtin", "examples"):
    assert env_class_name(text, tools=name in programs.BUILTIN["tool_use"]), name
  if kind == "families" and not name.endswith("_work"):
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)
            and n.name.endswith("Env")], name


def test_duplicate_names_and_unknown_names_are_refused(tmp_path, monkeypatch):
  with pytest.raises(UnknownNameError, match=r"Unknown env program 'nope'.*guess_secret"):
    programs.load_program("nope")
  with pytest.raises(ValueError, match="unknown env program kind 'games'"):
    programs.program_names("games")
  for kind, text in (("builtin", "x = 1\n"), ("examples", "y = 2\n")):
    (tmp_path / kind).mkdir()
    (tmp_path / kind / "twice.py").write_text(text)
  monkeypatch.setattr(programs, "_DIR", tmp_path)
  programs._index.cache_clear()  # pylint: disable=protected-access
  try:
    with pytest.raises(RuntimeError, match=r"'twice' is used twice: builtin/twice.py and "
                                           r"examples/twice.py"):
      programs.program_names()
  finally:
    monkeypatch.undo()
    programs._index.cache_clear()  # pylint: disable=protected-access
  assert "guess_secret" in programs.program_names("builtin")


def test_builtins_per_setting():
  listed = [n for names in programs.BUILTIN.values() for n in names]
  assert sorted(listed) == sorted(programs.program_names("builtin"))
  for setting, names in programs.BUILTIN.items():
    assert tuple(envs.builtin_programs(setting)) == names
    assert envs.builtin_programs(setting)["%s" % names[0]] == programs.load_program(names[0])
  # A built-in that shared a family's name was renamed; the old name says so.
  for old, new in programs.RENAMED.items():
    assert old in FAMILIES and new in listed and old not in listed
    with pytest.raises(UnknownNameError, match=f"'{old}' is now '{new}'"):
      envs.builtin_program(old)
  with pytest.raises(UnknownNameError, match="no built-in programs for setting 'chess'"):
    envs.builtin_programs("chess")


def test_families_read_their_bodies_and_work_from_the_files():
  for name, fam in FAMILIES.items():
    assert programs.program_kind(name) == "families"
    assert fam.body == programs.load_program(name)
    if fam.work:
      assert fam.work == programs.load_program(f"{name}_work")
    else:
      assert f"{name}_work" not in programs.program_names()
  extra = set(programs.program_names("families")) - set(FAMILIES) - {
      f"{n}_work" for n in FAMILIES}
  assert not extra, extra
  # Constants a family module needs (e.g. the names its perturbation draws) come from the text.
  text = programs.load_program("pet_owners")
  assert programs.program_constant(text, "PETS")[:2] == ("cat", "dog")
  with pytest.raises(KeyError, match="no module-level constant 'NOPE'"):
    programs.program_constant(text, "NOPE")


def _docstrings(tree):
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        out.add(id(body[0].value))
  return out


def _env_literals(source: str):
  """(line, assigned name) of every string literal, docstrings aside, holding an env class."""
  tree = ast.parse(source)
  docs, names = _docstrings(tree), {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      for sub in ast.walk(node.value):
        names[id(sub)] = node.targets[0].id
  found, inner = [], set()
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):  # an f-string: its fields read as a name
      inner |= {id(v) for v in node.values}
      text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and id(node) not in docs and id(node) not in inner):
      text = node.value
    else:
      continue
    if ENV_CLASS.search(text):
      found.append((node.lineno, names.get(id(node), "")))
  return found


def test_the_literal_scan_finds_program_text():
  src = ('"""class DocEnv: a docstring is prose."""\n'
         'X = "class EchoEnv:\\n  def step(self, a):\\n    return a\\n"\n'
         'Y = f"import random\\n\\nclass {1}Env(object):\\n  pass\\n"\n'
         'Z = "the FooEnv class"\n')
  assert _env_literals(src) == [(2, "X"), (3, "Y")]


def test_no_env_program_text_outside_the_program_home():
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE)
    if rel.parts[:2] == ("envs", "programs") and path.name != "__init__.py":
      continue
    for line, name in _env_literals(path.read_text(encoding="utf-8")):
      if (rel.as_posix(), name) not in ALLOWED:
        found.append(f"{rel}:{line} ({name or 'literal'})")
  assert not found, found


def test_static_pool_checkpoints_with_old_builtin_names_resume():
  make = lambda: baselines.StaticPool(baselines.StaticPoolConfig(validate=False),  # noqa: E731
                                      setting="games", validation=envs.ValidationConfig())
  sp = make()
  draws = [d.doc_id for it in range(3) for d in sp.draw(it, 3, None)]
  old = {new: o for o, new in programs.RENAMED.items()}
  state = json.loads(json.dumps(sp.state()))
  state["valid"] = [old.get(pid, pid) for pid in state["valid"]]
  assert "guess_number" in state["valid"]
  state["epoch"], state["pos"] = 0, 0
  resumed = make()
  resumed.restore(state)
  assert resumed.valid == list(programs.BUILTIN["games"])
  assert [d.doc_id for it in range(3) for d in resumed.draw(it, 3, None)] == draws
