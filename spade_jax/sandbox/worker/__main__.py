"""Entry of a sandbox worker: ``python -s -S -B [-P] .../worker/__main__.py CONFIG_JSON``.

Started by the pool (:mod:`spade_jax.sandbox.supply`) as a standalone script, usually
inside bubblewrap or ``unshare`` namespaces, so it imports nothing outside the standard
library and nothing from ``spade_jax``: a fresh worker starts in a few tens of
milliseconds, and the program cannot reach trainer code through ``sys.modules``.

It first loads the worker's modules (:data:`MODULES`, in that order): the pool's
precompiled copy (``CONFIG["worker_code"]``, written once per pool by
``isolation.write_worker_code``) when this interpreter compiled it, else the sources next
to this file, by absolute path. They run as the private package ``_spade_worker`` (their
relative imports resolve there) and leave ``sys.modules`` once loaded.

Two modes. Started by itself, the worker builds its jail (:func:`jail.isolate`: protocol
pipes off fds 0/1, confinement code loaded before any mount, mounts, limits, uid drop,
landlock and seccomp) and serves requests (:func:`host.serve`). With ``"zygote": true``
in the config it is the pool's fork server (:func:`zygote.main`), which forks workers
that do the same. Either way a worker serves framed JSON requests (:mod:`wire`) until
EOF; the load reply says which confinement layers are active, or why one is missing.
"""

import json
import os
import sys

PACKAGE = "_spade_worker"
MODULES = ("wire", "actions", "host", "jail", "zygote")


def _precompiled(spec):
  """{module: code object} from the pool's ``worker.code``, or None to compile."""
  path = spec.get("path")
  if not path or spec.get("hexversion") != sys.hexversion:
    return None
  import marshal  # pylint: disable=import-outside-toplevel
  try:
    with open(path, "rb") as f:
      codes = marshal.loads(f.read())
  except (OSError, ValueError, EOFError, TypeError):
    return None
  return codes if isinstance(codes, dict) else None


def load(spec=None):
  """The worker's modules, run as the private package :data:`PACKAGE`; {name: module}."""
  here = os.path.dirname(os.path.abspath(__file__))
  codes = _precompiled(spec or {}) or {}
  module_type = type(sys)
  package = module_type(PACKAGE)
  package.__path__ = []
  package.__package__ = PACKAGE
  names = [PACKAGE] + ["%s.%s" % (PACKAGE, name) for name in MODULES]
  sys.modules[PACKAGE] = package
  out = {}
  try:
    for name in MODULES:
      path = os.path.join(here, name + ".py")
      code = codes.get(name)
      if code is None:
        with open(path, "rb") as f:
          code = compile(f.read(), path, "exec")
      module = module_type("%s.%s" % (PACKAGE, name))
      module.__file__ = path
      module.__package__ = PACKAGE
      sys.modules[module.__name__] = module
      setattr(package, name, module)
      exec(code, module.__dict__)  # pylint: disable=exec-used
      out[name] = module
  finally:
    for name in names:
      sys.modules.pop(name, None)
  return out


def main():
  cfg = json.loads(sys.argv[1])
  modules = load(cfg.get("worker_code"))
  if cfg.get("zygote"):
    modules["zygote"].main(cfg)
  rfd, wfd = modules["jail"].isolate(cfg)
  modules["host"].serve(rfd, wfd, cfg)


if __name__ == "__main__":
  main()
