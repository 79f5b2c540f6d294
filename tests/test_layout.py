"""The package's shape: floors that import only downward, no cycles, one env contract."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "spade_jax"

# Each top-level module or subpackage and its floor; a module imports only from
# strictly lower floors (or from its own package).
FLOORS = {
    "registry": 0, "hostmem": 0,
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


TOPS = ("spade_jax", "experiments", "launch")
"""The repository's Python trees: the library and the two that use it."""


def _modules(tops: tuple[str, ...] = ("spade_jax",)) -> dict[str, pathlib.Path]:
  out = {}
  for path in (p for top in tops for p in (ROOT.parent / top).rglob("*.py")):
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _import_nodes(tree: ast.AST):
  """Every import statement: at module level, in functions and under ``if TYPE_CHECKING:``.

  An import made only for annotations still ties its module to the imported one, so it
  counts like any other; a name written only in a string annotation, without an import,
  is not an import.
  """
  return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def _imports_of(source: str, name: str, is_pkg: bool, modules) -> set[str]:
  """Modules of ``modules`` (the library's, or the repository's) that module ``name``
  (source text ``source``) imports."""
  found = set()
  for node in _import_nodes(ast.parse(source)):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith(TOPS)}
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = name.split(".")[:len(name.split(".")) - node.level + (1 if is_pkg else 0)]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      if not mod.startswith(TOPS):
        continue
      for a in node.names:  # `from pkg import submodule` imports the submodule
        found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
  return {m for m in found if m in modules and m != name}


def _imports(path: pathlib.Path, name: str, modules) -> set[str]:
  return _imports_of(path.read_text(), name, path.name == "__init__.py", modules)


def _graph(tops: tuple[str, ...] = ("spade_jax",)):
  modules = _modules(tops)
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The import cycles a depth-first walk of ``graph`` meets, each closed on its start."""
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
  return cycles


def test_no_import_cycles():
  cycles = _cycles(_graph())
  assert not cycles, cycles


def test_no_import_cycles_in_the_repository():
  """Experiments and launchers too: no circle, and the library never imports them."""
  graph = _graph(TOPS)
  assert any(n.startswith("experiments.") for n in graph), "experiments/ not scanned"
  assert any(n.startswith("launch.") for n in graph), "launch/ not scanned"
  cycles = _cycles(graph)
  assert not cycles, cycles
  upward = sorted(f"{src} -> {dst}" for src, dsts in graph.items() if src.startswith("spade_jax")
                  for dst in dsts if not dst.startswith("spade_jax"))
  assert not upward, upward


def test_repository_cycle_check_sees_a_circle():
  """The check itself: two experiment modules importing each other form a cycle."""
  a, b = "experiments.x.a", "experiments.x.b"
  modules = {a: None, b: None}
  graph = {a: _imports_of("from experiments.x import b\n", a, False, modules),
           b: _imports_of("import experiments.x.a\n", b, False, modules)}
  assert _cycles(graph) == [[a, b, a]]


ATTENTION, CONFIG = "spade_jax.models.attention", "spade_jax.models.config"


@pytest.mark.parametrize("attention", [
    # attention importing ModelConfig for annotations only: guarded, and plain.
    "from typing import TYPE_CHECKING\n"
    "if TYPE_CHECKING:\n  from spade_jax.models.config import ModelConfig\n"
    "def cache_shapes(cfg: ModelConfig): ...\n",
    "from spade_jax.models.config import ModelConfig\n"
    "def cache_shapes(cfg: ModelConfig): ...\n",
    "from spade_jax.models import config\n"
    "def cache_shapes(cfg: 'config.ModelConfig'): ...\n",
])
def test_annotation_only_imports_count(attention):
  """The old attention <-> config circle is found however attention imported the config."""
  modules = {ATTENTION: None, CONFIG: None}
  config = "from spade_jax.models.attention import ATTENTION, DECODE_ATTENTION\n"
  graph = {ATTENTION: _imports_of(attention, ATTENTION, False, modules),
           CONFIG: _imports_of(config, CONFIG, False, modules)}
  assert _cycles(graph) == [[ATTENTION, CONFIG, ATTENTION]]
  # A string annotation without an import is no import.
  graph[ATTENTION] = _imports_of("def cache_shapes(cfg: 'spade_jax.models.config.ModelConfig')"
                                 ": ...\n", ATTENTION, False, modules)
  assert not _cycles(graph)


def test_the_cache_layout_sits_above_attention_and_config():
  graph = _graph()
  assert not {m for m in graph[ATTENTION] if m.startswith("spade_jax.models")}, graph[ATTENTION]
  assert graph["spade_jax.models.cache"] == {CONFIG}
  assert ATTENTION in graph[CONFIG]


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


# Self-play's own layout: a floor (the config, the iteration state, the roles) below the
# stage rooms, and rooms in the order an iteration runs them; `iteration` orders them.
SELFPLAY_FLOOR = ("config", "state", "roles")
SELFPLAY_ROOMS = ("design", "hints", "play", "credit", "train")
SELFPLAY_ABOVE = ("iteration", "loop", "build")  # what orders or drives the rooms


def _selfplay(name: str) -> str:
  return f"spade_jax.selfplay.{name}"


def _room(name: str) -> str:
  return f"spade_jax.selfplay.stages.{name}"


def test_selfplay_parts_exist():
  modules = _modules()
  for name in SELFPLAY_FLOOR + SELFPLAY_ABOVE:
    assert _selfplay(name) in modules, name
  for name in SELFPLAY_ROOMS:
    assert _room(name) in modules, name
  rooms = {m for m in modules if m.startswith("spade_jax.selfplay.stages.")}
  assert rooms == {_room(r) for r in SELFPLAY_ROOMS}, sorted(rooms)


def test_selfplay_floor_lies_below_the_rooms():
  graph = _graph()
  above = {_room(r) for r in SELFPLAY_ROOMS} | {_selfplay(a) for a in SELFPLAY_ABOVE}
  for name in SELFPLAY_FLOOR:
    up = sorted(graph[_selfplay(name)] & above)
    assert not up, (name, up)


def test_each_room_imports_only_earlier_rooms():
  graph = _graph()
  above = {_selfplay(a) for a in SELFPLAY_ABOVE}
  for i, name in enumerate(SELFPLAY_ROOMS):
    deps = graph[_room(name)]
    later = sorted(d for d in deps if d.startswith("spade_jax.selfplay.stages.")
                   and d.rsplit(".", 1)[1] in SELFPLAY_ROOMS[i:])
    assert not later, (name, later)
    assert not deps & above, (name, sorted(deps & above))


def test_rooms_return_their_metrics():
  """A stage never writes into a dict it was handed (a `metrics` or `times` argument)."""
  writes = []
  for path in sorted((ROOT / "selfplay" / "stages").glob("*.py")):
    for fn in ast.walk(ast.parse(path.read_text())):
      if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      params = {a.arg for a in fn.args.args + fn.args.kwonlyargs} - {"self"}
      writes += [f"{path.name}:{fn.name} takes {p!r}" for p in params & {"metrics", "times"}]
      for node in ast.walk(fn):
        targets = []
        if isinstance(node, ast.Assign):
          targets = node.targets
        elif isinstance(node, ast.AugAssign):
          targets = [node.target]
        for t in targets:
          if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
              and t.value.id in params):
            writes.append(f"{path.name}:{fn.name} writes into {t.value.id!r}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("update", "setdefault")
            and isinstance(node.func.value, ast.Name) and node.func.value.id in params):
          writes.append(f"{path.name}:{fn.name} updates {node.func.value.id!r}")
  assert not writes, writes


def test_no_library_file_over_600_lines():
  long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
          if (n := len(p.read_text().splitlines())) > 600}
  assert not long, long


WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".npz",
                   ".h5", ".onnx")


def _tracked_files() -> list[pathlib.Path]:
  import subprocess  # pylint: disable=g-import-not-at-top
  repo = ROOT.parent
  if not (repo / ".git").exists():
    pytest.skip("not a git checkout")
  out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True)
  return [repo / p for p in out.stdout.decode().split("\0") if p]


def test_no_model_weights_are_tracked():
  """Weights and run state live in the cache (rebuilt by a command), never in git."""
  files = _tracked_files()
  weights = [str(p) for p in files if p.suffix in WEIGHT_SUFFIXES]
  big = [f"{p} ({p.stat().st_size} bytes)" for p in files
         if p.is_file() and p.stat().st_size > 2 * 1024 * 1024]
  assert not weights and not big, (weights, big)
