"""Name -> object tables: the one way the library looks things up by name.

Settings, reward variants, advantage and KL estimators, aggregation modes, rule
sets, presets and attention kernels are each a :class:`Registry`. Looking up a
name that is not there raises :class:`UnknownNameError`, whose message lists
the valid names and the config field that chose the bad one::

  KL_ESTIMATORS = Registry("KL estimator", {"k1": k1, "k3": k3},
                           field="loss.kl_estimator")
  KL_ESTIMATORS["k2"]   # UnknownNameError: Unknown KL estimator 'k2'; expected one
                        # of ['k1', 'k3']. Set loss.kl_estimator to one of them.

  @KL_ESTIMATORS.register("k2")
  def k2(logps, ref_logps): ...
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError, KeyError):
  """A name that no registry entry has (both a ValueError and a KeyError)."""

  def __str__(self) -> str:  # KeyError would quote the message.
    return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T], Generic[T]):
  """An ordered name -> object table whose failed lookups say what is valid.

  Args:
    kind: what an entry is, for messages ("designer reward variant").
    entries: initial entries.
    field: the config field that names an entry ("rewards.variant"), for messages.
  """

  def __init__(self, kind: str, entries: Mapping[str, T] | None = None, *, field: str = ""):
    self.kind, self.field = kind, field
    self._entries: dict[str, T] = {}
    for name, obj in (entries or {}).items():
      self.register(name, obj)

  def register(self, name: str, obj: T | None = None):
    """Adds ``obj`` under ``name``; without ``obj``, returns a decorator that does."""
    if obj is None:
      def wrap(fn: T) -> T:
        self.register(name, fn)
        return fn
      return wrap
    if name in self._entries:
      raise ValueError(f"{self.kind} {name!r} is already registered.")
    self._entries[name] = obj
    return obj

  def error(self, name: object) -> UnknownNameError:
    """The error for an unknown ``name``."""
    fix = f" Set {self.field} to one of them." if self.field else ""
    return UnknownNameError(f"Unknown {self.kind} {name!r}; expected one of "
                            f"{sorted(self._entries)}.{fix}")

  def __getitem__(self, name: str) -> T:
    try:
      return self._entries[name]
    except (KeyError, TypeError):
      raise self.error(name) from None

  def check(self, name: str) -> str:
    """Returns ``name`` if registered, else raises :class:`UnknownNameError`."""
    self[name]  # pylint: disable=pointless-statement
    return name

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self._entries)})"


def names(*values: str, kind: str, field: str = "") -> Registry[str]:
  """A registry of bare names (each maps to itself), for string choices."""
  return Registry(kind, {v: v for v in values}, field=field)


__all__ = ["Registry", "UnknownNameError", "names"]
