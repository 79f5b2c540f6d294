"""The env program contract: extraction from model output and static checks.

An env program is a Python source string (the limits and allow-list are in
:mod:`spade_jax.envs.contract`) defining one class whose name ends in ``Env``::

  class GuessEnv:
    def __init__(self, max_turns=25, **kwargs): ...
    def reset(self, seed=None, options=None) -> tuple[str, dict]: ...
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...
    def solution(self) -> list[str]: ...   # optional feasibility witness
    def hint(self) -> str: ...             # optional privileged hint

Action passing: callers always send the agent's raw turn text. With the
default ``action_mode="auto"`` (games) the sandbox passes ``step`` the content
of the last ``\\boxed{...}`` (or the stripped text when there is none), except
for reference-style programs whose source parses ``boxed`` themselves: those
receive the raw text. Tool-use programs are started with
``action_mode="tool_call"``: ``step`` receives the stripped JSON text inside
the last complete ``<tool_call>...</tool_call>`` outside ``<think>`` blocks, or
the stripped text when there is none (so ``solution()`` actions, bare JSON,
replay unchanged). ``reset`` programs without an ``options`` parameter
(``reset(self, seed=None)``) are called without it.

The static checks here are a quality filter that rejects obviously broken or
escape-minded programs early with a precise reason; they are not the security
boundary (that is :mod:`spade_jax.sandbox`).
"""

import ast
import re
import threading
from collections.abc import Collection

from spade_jax.envs.contract import ALLOWED_IMPORTS, COMPILER_DIRECTIVES, MAX_SOURCE_BYTES

# Names and attributes that only serve to escape the program's namespace or to
# touch the host; legitimate game code never needs them.
BANNED_NAMES = frozenset({
    "eval", "exec", "compile", "__import__", "open", "input", "breakpoint", "globals",
    "vars", "__builtins__", "__loader__", "__spec__", "memoryview",
})
BANNED_ATTRS = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__base__",
    "__bases__", "__mro__", "__getattribute__", "__reduce__", "__reduce_ex__", "__loader__",
    "__spec__", "__self__", "__func__", "__import__", "f_globals", "f_locals", "f_back",
    "f_builtins", "gi_frame", "gi_code", "cr_frame", "ag_frame", "tb_frame", "co_code",
    "mro",
})

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
# CPython 3.11 keeps the AST builder's recursion counter per interpreter, so
# ast.parse from several threads at once (validate_many) can fail with
# "AST constructor recursion depth mismatch": parse one program at a time.
_PARSE_LOCK = threading.Lock()
_ENV_CLASS = re.compile(r"^class\s+\w*Env\b", re.M)


def extract_program(text: str | None) -> str | None:
  """Pulls env program source out of model output.

  Prefers fenced blocks (```python / ```py / bare ```): among those defining a
  class whose name ends in ``Env``, the largest (the last one on ties);
  without such a block, the largest python-tagged block. Text after the last
  ``</think>`` is searched first. Unfenced text is accepted as raw source when
  it defines an ``...Env`` class.

  Returns:
    The source, or None when the text holds no code.
  """
  if not text:
    return None
  if "</think>" in text:
    text = text.rsplit("</think>", 1)[1]
  blocks = [(lang.lower(), body.strip("\n")) for lang, body in _FENCE.findall(text)]
  blocks = [(lang, body) for lang, body in blocks if body.strip()]
  if blocks:
    env_blocks = [body for _, body in blocks if _ENV_CLASS.search(body)]
    if env_blocks:
      best = max(range(len(env_blocks)), key=lambda i: (len(env_blocks[i]), i))
      return env_blocks[best]
    py = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    if py:
      return max(py, key=len)
    return None
  if _ENV_CLASS.search(text):
    return text.strip("\n")
  return None


def _env_class(tree: ast.Module, tools: bool = False) -> tuple[str | None, list[str]]:
  """Last top-level ``...Env`` class with reset/step (own or in-module bases); with
  ``tools``, with reset and at least one ``tool_<name>`` method instead."""
  classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

  def methods(name: str, seen: frozenset = frozenset()) -> set[str]:
    node = classes.get(name)
    if node is None or name in seen:
      return set()
    own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for base in node.bases:
      if isinstance(base, ast.Name):
        own |= methods(base.id, seen | {name})
    return own

  env_names = [n for n in classes if n.endswith("Env")]
  for name in reversed(env_names):
    have = methods(name)
    if tools and "reset" in have and any(m.startswith("tool_") for m in have):
      return name, env_names
    if not tools and {"reset", "step"} <= have:
      return name, env_names
  return None, env_names


def check_static(source: str, allowed_imports: Collection[str] = ALLOWED_IMPORTS,
                 max_bytes: int = MAX_SOURCE_BYTES, tools: bool = False
                 ) -> tuple[str | None, str, str | None]:
  """Static quality checks of env program source.

  Args:
    source: the program.
    allowed_imports: modules it may import (``from __future__`` is always allowed).
    max_bytes: size cap in UTF-8 bytes.
    tools: a tool-use program (reset and ``tool_<name>`` methods; the harness adds step).

  Returns:
    (reason, detail, class_name): reason is None when the source passes, else
    one of "too_large", "syntax", "contract", "forbidden".
  """
  size = len(source.encode("utf-8", "surrogatepass"))
  if size > max_bytes:
    return "too_large", f"program is {size} bytes; the cap is {max_bytes}", None
  try:
    with _PARSE_LOCK:
      tree = ast.parse(source)
  except SyntaxError as e:
    return "syntax", f"{e.msg} (line {e.lineno})", None
  except (ValueError, RecursionError, MemoryError) as e:
    return "syntax", f"{type(e).__name__}: {e}", None
  allowed = frozenset(allowed_imports) | frozenset(COMPILER_DIRECTIVES)
  name, env_names = _env_class(tree, tools)
  if name is None:
    found = ", ".join(env_names) or "none"
    need = "reset() and tool_<name>() methods" if tools else "reset() and step()"
    return "contract", ("expected a top-level class whose name ends in 'Env' defining "
                        f"{need}; classes ending in 'Env': {found}"), None
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        root = alias.name.split(".")[0]
        if root not in allowed:
          return "forbidden", _import_msg(alias.name, node.lineno, allowed_imports), name
    elif isinstance(node, ast.ImportFrom):
      mod = node.module or ""
      if node.level or mod.split(".")[0] not in allowed:
        return "forbidden", _import_msg("." * node.level + mod, node.lineno,
                                        allowed_imports), name
    elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
      return "forbidden", f"use of {node.id!r} at line {node.lineno} is not allowed", name
    elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
      return "forbidden", f"attribute {node.attr!r} at line {node.lineno} is not allowed", name
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
        and node.func.id in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) > 1:
      arg = node.args[1]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
          and (arg.value.startswith("__") or arg.value in BANNED_ATTRS):
        return "forbidden", (f"{node.func.id}(..., {arg.value!r}) at line {node.lineno} is "
                             "not allowed"), name
  return None, "", name


def env_class_name(source: str, tools: bool = False) -> str | None:
  """The env class :func:`check_static` would pick, or None (also when it does not parse)."""
  try:
    with _PARSE_LOCK:
      tree = ast.parse(source)
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  return _env_class(tree, tools)[0]


def _import_msg(module: str, line: int, allowed: Collection[str]) -> str:
  return (f"import of {module!r} at line {line} is not allowed; env programs may import "
          f"only: {', '.join(sorted(allowed))}")


__all__ = ["check_static", "env_class_name", "extract_program"]
