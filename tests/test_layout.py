"""The package's shape: floors that import only downward, no cycles, one env contract."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "spade_jax"

# Each top-level module or subpackage and its floor; a module imports only from
# strictly lower floors (or from its own package).
FLOORS = {
    "registry": 0,
    "parallel": 1, "sandbox": 1, "metrics": 1, "checkpoint": 1, "console": 1,
    "models": 2, "envs": 2,
    "sampling": 3, "rl": 3, "designer": 3,
    "eval": 4,
    "selfplay": 5, "plots": 5,
}
# Names of the env contract: assigned only in spade_jax/envs/contract.py.
CONTRACT_NAMES = ("ALLOWED_IMPORTS", "MAX_SOURCE_BYTES", "MAX_PROGRAM_BYTES", "SETTINGS",
                  "SKILLS", "REASONS", "VALIDATION_REASONS", "COMMON_RULES", "TOOL_DOMAINS",
                  "TOOL_TASK_TYPES", "HINT_SOURCES")


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in ROOT.rglob("*.py"):
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _runtime_nodes(tree: ast.AST):
  """Every node except those under ``if TYPE_CHECKING:`` (annotation-only imports)."""
  todo = [tree]
  while todo:
    node = todo.pop()
    yield node
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
        todo.extend(child.orelse)
        continue
      todo.append(child)


def _imports(path: pathlib.Path, name: str, modules) -> set[str]:
  """spade_jax modules that ``name`` imports at run time (module level or in functions)."""
  found = set()
  is_pkg = path.name == "__init__.py"
  for node in _runtime_nodes(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("spade_jax")}
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = name.split(".")[:len(name.split(".")) - node.level + (1 if is_pkg else 0)]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      if not mod.startswith("spade_jax"):
        continue
      for a in node.names:  # `from pkg import submodule` imports the submodule
        found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
  return {m for m in found if m in modules and m != name}


def _graph():
  modules = _modules()
  return {name: _imports(path, name, modules) for name, path in modules.items()}


def _floor(module: str) -> tuple[str, int] | None:
  parts = module.split(".")
  if len(parts) < 2:
    return None  # the package root
  return parts[1], FLOORS[parts[1]]


def test_every_top_level_part_has_a_floor():
  parts = {p.split(".")[1] for p in _modules() if "." in p}
  assert parts <= set(FLOORS), sorted(parts - set(FLOORS))


def test_imports_only_go_down():
  upward = []
  for src, dsts in _graph().items():
    s = _floor(src)
    for dst in dsts:
      d = _floor(dst)
      if s is None or d is None or s[0] == d[0]:
        continue
      if d[1] >= s[1]:
        upward.append(f"{src} -> {dst}")
  assert not upward, upward


def test_no_import_cycles():
  graph = _graph()
  state: dict[str, int] = {}
  cycles = []

  def visit(node, stack):
    state[node] = 1
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        cycles.append(stack[stack.index(nxt):] + [nxt])
      elif nxt not in state:
        visit(nxt, stack + [nxt])
    state[node] = 2

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  assert not cycles, cycles


@pytest.mark.parametrize("name", CONTRACT_NAMES)
def test_contract_constants_are_defined_once(name):
  where = []
  for module, path in _modules().items():
    for node in ast.walk(ast.parse(path.read_text())):
      targets = []
      if isinstance(node, ast.Assign):
        targets = node.targets
      elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
      if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        where.append(module)
  assert len(where) <= 1, (name, where)
  if name != "HINT_SOURCES" and where:
    assert where == ["spade_jax.envs.contract"], (name, where)
