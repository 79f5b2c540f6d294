# The `families` module of a sandbox worker (built there by `envs.families.library`; never
# imported by the trainer). Completed by code: `_SPECS = {name: (class name, knob names,
# body)}` goes above this text. Each family becomes an attribute module with a `Game` base:
# `start(seed, options, **knobs)` runs the family's body with the knobs as its globals and
# resets its env; `move`, `solution` and `hint` are that env's.
import sys
import types

_CODE = {}
_CLASSES = {}


def _env_class(name, knobs):
  cls_name, knob_names, body = _SPECS[name]
  need = sorted(set(knob_names) | {"TURNS"})
  if sorted(knobs) != need:
    raise TypeError("%s: start() takes the knobs %s; got %s" % (name, need, sorted(knobs)))
  key = (name, tuple(sorted(knobs.items())))
  if key not in _CLASSES:
    if name not in _CODE:
      _CODE[name] = compile(body, "<family %s>" % name, "exec")
    scope = dict(knobs, __name__="families." + name)
    exec(_CODE[name], scope)
    _CLASSES[key] = scope[cls_name]
  return _CLASSES[key]


class Game:
  """A family's game at the knob values it starts with (the base of a program's env)."""

  FAMILY = ""

  def __init__(self, max_turns=25, **kwargs):
    self._max_turns = max_turns
    self._kwargs = kwargs
    self._env = None

  def start(self, seed=None, options=None, **knobs):
    self._env = _env_class(self.FAMILY, knobs)(max_turns=self._max_turns, **self._kwargs)
    return self._env.reset(seed=seed, options=options)

  def _live(self):
    if self._env is None:
      raise RuntimeError("%s: reset() (self.start(...)) comes first" % type(self).__name__)
    return self._env

  def move(self, action):
    return self._live().step(action)

  def solution(self):
    return self._live().solution()

  def hint(self):
    return self._live().hint()


for _name in _SPECS:
  _mod = types.ModuleType(__name__ + "." + _name)
  _mod.Game = type("Game", (Game,), {"FAMILY": _name, "__module__": _mod.__name__})
  setattr(sys.modules[__name__], _name, _mod)
