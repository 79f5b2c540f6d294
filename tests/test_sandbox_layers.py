"""Sandbox kernel layers (seccomp, landlock) and the tool_call action mode.

Most tests run workers without any namespace launcher (no bubblewrap, no
unshare), so what they show holds by seccomp and landlock alone.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

from spade_jax.sandbox import ACTION_MODES, DEFAULT_PREIMPORT, EnvPool, SandboxConfig, _confine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="seccomp and landlock are Linux kernel features")

BARE_CFG = SandboxConfig(use_bwrap=False, use_unshare=False, num_workers=1, call_timeout_s=2.0,
                         load_timeout_s=5.0, memory_mb=512, cpu_seconds=30, self_test=False,
                         fork_server=os.environ.get("SPADE_TEST_SANDBOX_NO_FORK_SERVER") != "1")
LANDLOCK_ABI, NO_LANDLOCK_WHY = _confine.landlock_abi()
SECCOMP_ARCH = _confine.machine() in ("x86_64", "aarch64")
BPF_NR = {"x86_64": 321, "aarch64": 280}.get(_confine.machine(), -1)

needs_landlock = pytest.mark.skipif(not LANDLOCK_ABI, reason=f"no landlock: {NO_LANDLOCK_WHY}")
needs_seccomp = pytest.mark.skipif(not SECCOMP_ARCH,
                                   reason=f"no seccomp table for {_confine.machine()}")

# Tries each operation named in options["ops"]; reports "ok" or the errno name.
SYSCALL_PROBE = r'''
import ctypes, errno, json, os, socket

class SyscallEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def attempt(name, fn):
      try:
        rc = fn()
        if isinstance(rc, int) and rc < 0:
          out[name] = errno.errorcode.get(ctypes.get_errno(), "?")
        else:
          out[name] = "ok"
      except OSError as e:
        out[name] = errno.errorcode.get(e.errno, type(e).__name__)
    fams = {"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX,
            "netlink": socket.AF_NETLINK, "packet": getattr(socket, "AF_PACKET", 17)}
    for name, fam in fams.items():
      attempt("socket_" + name, lambda fam=fam: socket.socket(fam, socket.SOCK_DGRAM).close())
    attempt("socketpair", lambda: [s.close() for s in socket.socketpair()] and 0)
    # A child of the same uid: without seccomp the worker may trace it.
    target = os.fork()
    if target == 0:
      import time
      time.sleep(30)
      os._exit(0)
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    attempt("process_vm_readv", lambda: libc.process_vm_readv(target, iov, 1, iov, 1, 0))
    attempt("ptrace", lambda: libc.ptrace(16, target, None, None))  # PTRACE_ATTACH
    os.kill(target, 9)
    os.waitpid(target, 0)
    attempt("unshare_user", lambda: libc.unshare(0x10000000))  # CLONE_NEWUSER
    attempt("mount", lambda: libc.mount(b"none", b".", b"tmpfs", 0, None))
    attempt("bpf", lambda: libc.syscall(options["bpf_nr"], 0, None, 0))
    def fork_once():
      pid = os.fork()
      if pid == 0:
        os._exit(0)
      return os.waitpid(pid, 0)[1]
    attempt("fork", fork_once)
    return json.dumps(out), {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''

FILE_PROBE = r'''
import json, os

class FileEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    out = {}
    def attempt(name, fn):
      try:
        out[name] = fn()
      except Exception as e:
        out[name] = type(e).__name__
    def read(p):
      with open(p) as f:
        return f.read()
    def write(p):
      with open(p, "w") as f:
        f.write("x")
      return "written"
    attempt("planted", lambda: read(options["planted"]))
    attempt("outside_write", lambda: write(options["outside"]))
    attempt("scratch_write", lambda: write("in_scratch") and read("in_scratch"))
    attempt("stdlib", lambda: __import__("fractions").Fraction(1, 3) and "imported")
    attempt("devnull", lambda: write("/dev/null"))
    return json.dumps(out), {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''

ECHO = '''
class EchoEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    return "go", {}

  def step(self, action):
    return action, 0.0, False, False, {}
'''


@pytest.fixture(scope="module")
def bare_pool():
  with EnvPool(BARE_CFG) as p:
    assert p.plan.launcher == "none"
    yield p


def probe(pool, source, options):
  # Without a mount namespace the interpreter prefix (e.g. under /root) may be
  # unreadable after the uid drop: pre-import what the probes use.
  h = pool.start([source], preimport=DEFAULT_PREIMPORT + ("ctypes", "socket", "errno"))[0]
  try:
    assert h.alive, (h.reason, h.detail)
    r = pool.reset_many([h], seeds=[0], options=options)[0]
    assert r.ok, r
    return json.loads(r.value[0]), h.layers
  finally:
    pool.release([h])


# ---- seccomp -----------------------------------------------------------------------


@needs_seccomp
def test_seccomp_denies_sockets_and_process_access_without_namespaces(bare_pool):
  out, layers = probe(bare_pool, SYSCALL_PROBE, {"bpf_nr": BPF_NR})
  assert layers["seccomp"].startswith("active"), layers
  for name in ("socket_inet", "socket_inet6", "socket_unix", "socket_netlink", "socket_packet",
               "ptrace", "process_vm_readv", "unshare_user", "mount", "bpf"):
    assert out[name] == "EPERM", (name, out)
  assert out["socketpair"] == "ok" and out["fork"] == "ok", out


def test_seccomp_off_leaves_sockets():
  cfg = dataclasses.replace(BARE_CFG, seccomp=False, landlock=False, num_workers=0)
  with EnvPool(cfg) as p:
    out, layers = probe(p, SYSCALL_PROBE, {"bpf_nr": BPF_NR})
  assert layers == {"seccomp": "off", "landlock": "off"}
  # What the filter adds here. (ptrace and process_vm_readv stay denied: a
  # process that changed uid is not dumpable, so even its own child is off limits.)
  assert out["socket_inet"] == "ok" and out["unshare_user"] == "ok", out


@needs_seccomp
def test_foreign_syscall_abi_kills_the_worker(bare_pool):
  if _confine.machine() != "x86_64":
    pytest.skip("the x32 syscall ABI exists on x86_64 only")
  src = ("import ctypes\nclass X32Env:\n  def __init__(self, max_turns=25):\n    pass\n"
         "  def reset(self, seed=None, options=None):\n"
         "    ctypes.CDLL(None).syscall(0x40000000 | 39)\n    return 'alive', {}\n"
         "  def step(self, a):\n    return '', 0.0, True, False, {}\n")
  h = bare_pool.start([src])[0]
  r = bare_pool.reset_many([h])[0]
  assert not r.ok and r.reason == "crash" and "SIGSYS" in r.detail, r
  bare_pool.release([h])


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_seccomp_program_is_well_formed(arch):
  prog = _confine.seccomp_program(arch)
  assert len(prog) < 255
  for i, (code, jt, jf, _) in enumerate(prog):
    if code & 0x07 == 0x05:  # BPF_JMP: both targets inside the program
      assert i + 1 + max(jt, jf) < len(prog)
  assert prog[-1] == (0x06, 0, 0, 0x7FFF0000)  # default: allow
  with pytest.raises(ValueError, match="architecture"):
    _confine.seccomp_program("mips")


# ---- landlock ------------------------------------------------------------------------


@pytest.fixture()
def planted():
  """A world-readable file and a world-writable dir outside every allowed path."""
  d = tempfile.mkdtemp(prefix="spade_landlock_", dir=os.path.expanduser("~"))
  os.chmod(d, 0o777)
  secret = os.path.join(d, "planted.txt")
  with open(secret, "w") as f:
    f.write("planted-" + uuid.uuid4().hex)
  os.chmod(secret, 0o644)
  outside = os.path.join(d, "escape")
  yield secret, outside
  for p in (secret, outside):
    if os.path.exists(p):
      os.unlink(p)
  os.rmdir(d)


@needs_landlock
def test_landlock_confines_reads_and_writes(planted):
  secret, outside = planted
  # The uid drop alone would also stop a read under /root; run as the pool's
  # own uid so landlock is the only layer in the way.
  cfg = dataclasses.replace(BARE_CFG, drop_uid=False, num_workers=0)
  opts = {"planted": secret, "outside": outside}
  with EnvPool(cfg) as p:
    out, layers = probe(p, FILE_PROBE, opts)
  assert layers["landlock"].startswith("active"), layers
  assert out["planted"] == "PermissionError" and out["outside_write"] == "PermissionError", out
  assert not os.path.exists(outside)
  assert out["scratch_write"] == "x" and out["stdlib"] == "imported", out
  assert out["devnull"] == "written", out
  with EnvPool(dataclasses.replace(cfg, landlock=False)) as p:
    control, layers = probe(p, FILE_PROBE, opts)
  assert layers["landlock"] == "off"
  assert control["planted"].startswith("planted-"), control  # landlock was what held


def test_landlock_missing_is_reported(monkeypatch):
  monkeypatch.setattr(_confine, "landlock_abi", lambda libc=None: (0, "kernel lacks landlock"))
  with pytest.raises(OSError, match="kernel lacks landlock"):
    _confine.apply_landlock(["/usr"], [], [])


# ---- self-test report ------------------------------------------------------------------


def test_self_test_lists_kernel_layers():
  cfg = dataclasses.replace(BARE_CFG, self_test=True, num_workers=0)
  with EnvPool(cfg) as p:
    report = p.report
  assert "landlock" in report.layers and "seccomp" in report.layers
  assert report.layers["seccomp"] == SECCOMP_ARCH, report.summary()
  assert report.layers["landlock"] == bool(LANDLOCK_ABI), report.summary()
  if not LANDLOCK_ABI:
    assert "landlock (" in report.summary()
  with EnvPool(dataclasses.replace(cfg, seccomp=False)) as p:
    summary = p.report.summary()
  assert not p.report.layers["seccomp"]
  assert "seccomp (disabled by SandboxConfig.seccomp=False)" in summary


# ---- wherever the code lives -------------------------------------------------------------

# Runs a pool from a copy of the package (argv[1]) and prints what it reports.
POOL_FROM_COPY = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from spade_jax.sandbox import EnvPool, SandboxConfig, isolation
cfg = SandboxConfig(use_bwrap=False, num_workers=0, fork_server=sys.argv[2] == "1")
with EnvPool(cfg) as pool:
  src = "class E" + "nv:\n  def reset(self, seed=None):\n    return 'o', {}\n" \
        "  def step(self, a):\n    return 'o', 0.0, True, False, {}\n"
  hs = pool.start([src, src])
  print(json.dumps({"file": isolation.__file__, "launcher": pool.plan.launcher,
                    "note": pool.fork_server_note, "layers": pool.report.layers,
                    "why": pool.report.why, "handles": [h.layers for h in hs]}))
'''


@pytest.mark.skipif(not (LANDLOCK_ABI or SECCOMP_ARCH),
                    reason=f"neither landlock ({NO_LANDLOCK_WHY}) nor a seccomp table for "
                           f"{_confine.machine()}")
@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
@pytest.mark.parametrize("where", ["/tmp", "~"])
def test_confinement_holds_without_bwrap_wherever_the_code_lives(where, fork_server):
  # Without bubblewrap, as root, workers mount a private tmpfs over /tmp: code
  # that lives there (a checkout, or the pool's precompiled _confine) must
  # already be loaded by then.
  package = pathlib.Path(__file__).resolve().parents[1] / "spade_jax"
  root = tempfile.mkdtemp(prefix="spade_copy_", dir=os.path.expanduser(where))
  try:
    dest = pathlib.Path(root) / "spade_jax"
    dest.mkdir()
    for name in ("__init__.py", "registry.py"):
      shutil.copy(package / name, dest / name)
    shutil.copytree(package / "sandbox", dest / "sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", POOL_FROM_COPY, root, str(int(fork_server))],
                          capture_output=True, text=True, timeout=120, cwd="/",
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=False)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["file"].startswith(root), out["file"]  # the copy ran, not the checkout
  if not fork_server:
    assert "one by one" in out["note"], out["note"]
  for layer, expected in (("landlock", bool(LANDLOCK_ABI)), ("seccomp", SECCOMP_ARCH)):
    assert out["layers"][layer] == expected, (layer, out)
    for layers in out["handles"]:
      assert layers[layer].startswith("active") == expected, (layer, layers)


# ---- tool_call action mode -------------------------------------------------------------


def test_tool_call_action_mode(bare_pool):
  h = bare_pool.start([ECHO], action_mode="tool_call")[0]
  assert h.alive and h.action_mode == "tool_call"
  assert bare_pool.reset_many([h])[0].ok
  call = '{"name": "lookup", "arguments": {"id": 3}}'
  cases = [
      (f"I will look it up.\n<tool_call>\n{call}\n</tool_call>", call),
      ('<tool_call>{"name": "a"}</tool_call> then <tool_call>' + call + "</tool_call>", call),
      # Calls inside thinking do not count; an unclosed last call is ignored.
      (f"<think><tool_call>{{}}</tool_call></think><tool_call>{call}</tool_call>"
       "<tool_call>{\"name\": \"cut", call),
      ("<think>maybe <tool_call>{}</tool_call></think> no call after all  ",
       "<think>maybe <tool_call>{}</tool_call></think> no call after all"),
      (f"  {call}\n", call),  # bare JSON (e.g. solution() actions) passes through
      ("\\boxed{3}", "\\boxed{3}"),
  ]
  res = bare_pool.step_many([h] * 1, [cases[0][0]])
  assert res[0].ok and res[0].value[0] == cases[0][1]
  for text, want in cases[1:]:
    r = bare_pool.step_many([h], [text])[0]
    assert r.ok and r.value[0] == want, (text, r)
  bare_pool.release([h])


def test_default_action_mode_stays_auto(bare_pool):
  assert "tool_call" in ACTION_MODES
  h = bare_pool.start([ECHO])[0]
  assert h.action_mode == "boxed"
  bare_pool.reset_many([h])
  r = bare_pool.step_many([h], ["<tool_call>{}</tool_call> \\boxed{7}"])[0]
  assert r.value[0] == "7"
  bare_pool.release([h])
  with pytest.raises(ValueError, match="tool_call"):
    bare_pool.start([ECHO], action_mode="json")


# ---- the worker package -----------------------------------------------------------------

WORKER_DIR = pathlib.Path(__file__).resolve().parents[1] / "spade_jax" / "sandbox" / "worker"


def _worker_entry():
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("worker_entry", WORKER_DIR / "__main__.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_worker_modules_are_standard_library_only():
  import ast  # pylint: disable=import-outside-toplevel
  from spade_jax.sandbox import worker  # pylint: disable=import-outside-toplevel
  assert _worker_entry().MODULES == worker.MODULES
  for path in WORKER_DIR.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        assert name.split(".")[0] in sys.stdlib_module_names, (path.name, name)


def test_worker_runs_the_pools_precompiled_code_else_its_sources(tmp_path):
  import marshal  # pylint: disable=import-outside-toplevel
  from spade_jax.sandbox import isolation  # pylint: disable=import-outside-toplevel
  entry = _worker_entry()
  path = isolation.write_worker_code(str(tmp_path))
  codes = marshal.loads(pathlib.Path(path).read_bytes())
  assert sorted(codes) == sorted(entry.MODULES)
  # A marked copy shows which code a worker ran.
  codes["actions"] = compile("MARK = 'precompiled'\n" + (WORKER_DIR / "actions.py").read_text(),
                             str(WORKER_DIR / "actions.py"), "exec")
  pathlib.Path(path).write_bytes(marshal.dumps(codes))
  loaded = entry.load(isolation.worker_code_spec(path, sys.hexversion))
  assert loaded["actions"].MARK == "precompiled"
  assert loaded["host"].actions is loaded["actions"]  # relative imports resolve in the copy
  # Another interpreter version compiles the sources next to the entry.
  loaded = entry.load(isolation.worker_code_spec(path, sys.hexversion + 1))
  assert not hasattr(loaded["actions"], "MARK")
  assert loaded["host"].parses_boxed("x = t.rfind('\\\\boxed{')")
  assert not [m for m in sys.modules if m.startswith(entry.PACKAGE)]  # none stays importable


def test_a_program_finds_no_worker_module(bare_pool):
  src = ("import sys\n\nclass ModsEnv:\n  def reset(self, seed=None, options=None):\n"
         "    return ' '.join(m for m in sys.modules if 'worker' in m or 'spade' in m), {}\n"
         "  def step(self, a):\n    return '', 0.0, True, False, {}\n")
  h = bare_pool.start([src])[0]
  r = bare_pool.reset_many([h])[0]
  assert r.ok and r.value[0] == "", r
  bare_pool.release([h])
