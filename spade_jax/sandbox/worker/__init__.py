"""The sandbox worker, in layers; standard library only.

``wire`` (framing), ``actions`` (reading answers and actions out of model text: the
library's one parser), ``host`` (the program host and request loop), ``jail`` (the OS
jail), ``zygote`` (the fork server), and ``__main__`` (the entry the pool starts as a
script). The pool ships these modules precompiled (``isolation.write_worker_code``), the
way it ships the confinement module ``_confine.py``.

In the library (not in a worker) ``actions`` is imported as a normal module, e.g. by
``eval.answers``.
"""

MODULES = ("wire", "actions", "host", "jail", "zygote")
