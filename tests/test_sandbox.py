"""Sandbox worker pool: API behaviour and hostile programs, each contained."""

import dataclasses
import json
import os
import pathlib
import signal
import socket
import tempfile
import time
import uuid

import pytest

from spade_jax.envs import builtin_program
from spade_jax.sandbox import DEFAULT_PREIMPORT, CallResult, EnvPool, SandboxConfig

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "programs"
SECRET = "spade-secret-" + uuid.uuid4().hex
# SPADE_TEST_SANDBOX_NO_BWRAP=1 runs this module as on a host without bubblewrap;
# SPADE_TEST_SANDBOX_NO_FORK_SERVER=1 starts every worker by itself (no fork server).
TEST_CFG = SandboxConfig(num_workers=2, call_timeout_s=1.0, load_timeout_s=5.0,
                         memory_mb=512, cpu_seconds=30,
                         use_bwrap=os.environ.get("SPADE_TEST_SANDBOX_NO_BWRAP") != "1",
                         fork_server=os.environ.get("SPADE_TEST_SANDBOX_NO_FORK_SERVER") != "1")


def fixture(name: str) -> str:
  return (FIXTURES / f"{name}.py").read_text()


def sandbox_pids(pool: EnvPool, uid: int | None = None) -> list[int]:
  """Host pids running as ``uid``, or anywhere in the pool's per-worker uid range."""
  cfg = pool.config
  out = []
  for p in os.listdir("/proc"):
    if p.isdigit():
      try:
        uid_of = os.stat(f"/proc/{p}").st_uid
      except OSError:
        continue
      in_range = cfg.uid_base <= uid_of < cfg.uid_base + cfg.uid_count
      if (uid_of == uid) if uid is not None else in_range:
        out.append(int(p))
  return out


def wait_gone(pids, timeout=3.0) -> list[int]:
  deadline = time.monotonic() + timeout
  alive = list(pids)
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if os.path.exists(f"/proc/{p}")
             and "Z" not in _state(p)]
    time.sleep(0.05)
  return alive


def _status(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/status") as f:
      lines = f.read().splitlines()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmd = f.read().replace(b"\0", b" ")[:200].decode()
    return " | ".join(l for l in lines if l.startswith(("State", "PPid", "NSpid", "Uid"))) + cmd
  except OSError:
    return f"{pid}: gone"


def _state(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except OSError:
    return "Z"


@pytest.fixture(scope="module")
def secret_file():
  d = tempfile.mkdtemp(prefix="spade_secret_")
  os.chmod(d, 0o755)
  path = os.path.join(d, "credentials.json")
  with open(path, "w") as f:
    f.write(SECRET)
  os.chmod(path, 0o644)
  yield path
  os.unlink(path)
  os.rmdir(d)


@pytest.fixture(scope="module")
def pool():
  os.environ["SPADE_TEST_SECRET"] = SECRET
  try:
    with EnvPool(TEST_CFG) as p:
      yield p
  finally:
    os.environ.pop("SPADE_TEST_SECRET", None)


def needs(pool, *modules):
  """``preimport`` for a program importing ``modules`` beyond the defaults.

  Without bubblewrap's mount namespace the interpreter prefix may be unreadable
  after the uid drop, so such modules are imported before it.
  """
  return None if pool.plan.launcher == "bwrap" else DEFAULT_PREIMPORT + modules


def run_one(pool, name, op="reset", options=None, action="x", source=None, preimport=None):
  h = pool.start([source or fixture(name)], preimport=preimport)[0]
  try:
    assert h.alive, (h.reason, h.detail)
    if op == "reset":
      return h, pool.reset_many([h], seeds=[0], options=options)[0]
    r = pool.reset_many([h], seeds=[0], options=options)[0]
    assert r.ok, r
    return h, pool.step_many([h], [action])[0]
  finally:
    pool.release([h])


# ---- API ---------------------------------------------------------------------------


def test_isolation_layers_active(pool):
  report = pool.report
  assert report is not None
  if report.launcher == "none":
    pytest.skip("no namespace support on this host")
  for layer in ("net_namespace", "pid_namespace", "env_scrubbed", "accelerators_hidden"):
    assert report.layers[layer], report.summary()
  if os.geteuid() == 0:
    assert report.layers["uid_drop"], report.summary()
  if report.launcher == "bwrap":
    assert report.layers["host_files_hidden"] and report.layers["writes_confined"]
  assert "seccomp" in report.layers and "landlock" in report.layers, report.summary()


def test_reset_step_hint_solution(pool):
  src = builtin_program("guess_secret")
  hs = pool.start([src, src, src])
  assert all(h.alive and h.class_name == "GuessNumberEnv" for h in hs)
  assert hs[0].has_solution and hs[0].has_hint and hs[0].action_mode == "boxed"
  res = pool.reset_many(hs, seeds=[0, 0, 1])
  assert all(isinstance(r, CallResult) and r.ok for r in res)
  obs, info = res[0].value
  assert isinstance(obs, str) and info == {}
  sols = pool.call_many(hs, "solution")
  assert sols[0].value == sols[1].value and len(sols[0].value) == 1
  hints = pool.call_many(hs, "hint")
  assert all(r.ok and "between" in r.value for r in hints)
  secret = sols[0].value[0]
  steps = pool.step_many(hs[:2], [f"I think it is \\boxed{{{secret}}}.", f"  {secret} "])
  for r in steps:
    obs, reward, terminated, truncated, info = r.value
    assert reward == 1.0 and terminated is True and truncated is False
  pool.release(hs)
  assert not any(h.alive for h in hs)
  dead = pool.step_many(hs[:1], ["1"])[0]
  assert not dead.ok and dead.reason == "crash" and "released" in dead.detail


def test_missing_optional_method_keeps_handle(pool):
  h = pool.start([fixture("infeasible")])[0]
  assert pool.reset_many([h], seeds=[3])[0].ok
  r = pool.call_many([h], "hint")[0]
  assert not r.ok and r.reason == "contract" and h.alive
  bad = pool.call_many([h], "__init__")[0]
  assert not bad.ok and bad.reason == "contract"
  assert pool.step_many([h], ["1"])[0].ok
  pool.release([h])


def test_work_method_returns_text_or_a_contract_failure(pool):
  base = builtin_program("guess_secret")
  good = base + "\n\ndef work(self):\n  return f'{self.secret} is it'\n\nGuessNumberEnv.work = work\n"
  bad = base + "\n\ndef work(self):\n  return [1]\n\nGuessNumberEnv.work = work\n"
  hs = pool.start([good, bad, base])
  assert pool.reset_many(hs, seeds=[4, 4, 4])[0].ok
  secret = pool.call_many(hs[:1], "solution")[0].value[0]
  ok, wrong, missing = pool.call_many(hs, "work")
  assert ok.ok and ok.value == f"{secret} is it"
  assert not wrong.ok and wrong.reason == "contract" and "work()" in wrong.detail
  assert not missing.ok and missing.reason == "contract" and hs[2].alive  # optional
  pool.release(hs)


def test_reference_style_program_gets_raw_action(pool):
  h = pool.start([fixture("reference_style")])[0]
  assert h.alive and h.action_mode == "raw"
  assert pool.reset_many([h], seeds=[5])[0].ok
  secret = pool.call_many([h], "solution")[0].value[0]
  r = pool.step_many([h], [f"Let me think... \\boxed{{{secret}}}"])[0]
  assert r.ok and r.value[1] == 1.0 and r.value[4]["raw"].startswith("Let me think")
  pool.release([h])


@pytest.mark.parametrize("source,reason", [
    ("class BrokenEnv:\n  def reset(self\n", "syntax"),
    ("x = 1\n", "contract"),
    ("class BoomEnv:\n  def __init__(self, max_turns=25):\n    raise ValueError('no')\n"
     "  def reset(self, seed=None, options=None):\n    pass\n"
     "  def step(self, a):\n    pass\n", "crash"),
    ("class BadEnv:\n  def __init__(self, **kw):\n    pass\n"
     "  def reset(self, seed=None, options=None):\n    return 'obs'\n"
     "  def step(self, a):\n    return 'o', 0.0, 1, False, {}\n", "contract"),
])
def test_load_and_contract_failures(pool, source, reason):
  h = pool.start([source])[0]
  if h.alive:
    r = pool.reset_many([h], seeds=[0])[0]
    assert not r.ok and r.reason == reason, r
  else:
    assert h.reason == reason, h.detail
  assert not h.alive
  pool.release([h])


def test_step_many_runs_concurrently(pool):
  src = ("import time\nclass NapEnv:\n  def __init__(self, max_turns=25):\n    pass\n"
         "  def reset(self, seed=None, options=None):\n    return 'r', {}\n"
         "  def step(self, a):\n    time.sleep(0.4)\n    return 'o', 0.0, False, False, {}\n")
  hs = pool.start([src] * 4)
  pool.reset_many(hs)
  t = time.monotonic()
  res = pool.step_many(hs, ["a"] * 4)
  assert all(r.ok for r in res)
  assert time.monotonic() - t < 1.2
  pool.release(hs)


def test_timeout_kills_only_the_slow_env(pool):
  loop = fixture("hostile_infinite_loop")
  ok_src = builtin_program("running_total")
  hs = pool.start([loop, ok_src])
  pool.reset_many(hs, seeds=[0, 0])
  t = time.monotonic()
  res = pool.step_many(hs, ["1", "1"])
  assert time.monotonic() - t < TEST_CFG.call_timeout_s + 1.0
  assert res[0].reason == "timeout" and not hs[0].alive
  assert res[1].ok and hs[1].alive
  pool.release(hs)


# ---- hostile programs -------------------------------------------------------------


def test_long_sleep_times_out(pool):
  _, r = run_one(pool, "hostile_sleep")
  assert not r.ok and r.reason == "timeout"


def test_ignored_sigterm_still_killed(pool):
  h = pool.start([fixture("hostile_ignore_sigterm")])[0]
  pid = h.pid
  pool.reset_many([h])
  r = pool.step_many([h], ["x"])[0]
  assert r.reason == "timeout"
  pool.release([h])
  assert not wait_gone([pid])


def test_memory_bomb_is_a_memory_outcome():
  cfg = dataclasses.replace(TEST_CFG, memory_mb=160, call_timeout_s=10.0, num_workers=0,
                            self_test=False)
  with EnvPool(cfg) as p:
    _, r = run_one(p, "hostile_memory_bomb")
    assert not r.ok and r.reason == "memory", r
    # A single allocation beyond the limit fails at once, the worker survives it.
    src = ("class BigEnv:\n  def __init__(self, max_turns=25):\n    pass\n"
           "  def reset(self, seed=None, options=None):\n    x = bytearray(1 << 30)\n"
           "    return 'no', {}\n  def step(self, a):\n    return 'o', 0.0, True, False, {}\n")
    _, r = run_one(p, None, source=src)
    assert not r.ok and r.reason == "memory", r


def test_fork_bomb_is_contained(pool):
  if not pool.plan.drop_uid:
    pytest.skip("RLIMIT_NPROC per worker needs the per-worker uid (run as root)")
  h = pool.start([fixture("hostile_fork_bomb")])[0]
  uid = h.uid
  r = pool.reset_many([h])[0]
  assert not r.ok and r.reason in ("timeout", "crash")
  assert len(sandbox_pids(pool, uid)) <= TEST_CFG.max_processes
  pool.release([h])
  left = wait_gone(sandbox_pids(pool, uid))
  assert not left, [_status(p) for p in left]


def test_writes_stay_in_scratch(pool):
  nonce = uuid.uuid4().hex
  open_dir = tempfile.mkdtemp(prefix="spade_open_")
  os.chmod(open_dir, 0o777)
  targets = [f"/tmp/spade_escape_{nonce}", f"/root/spade_escape_{nonce}",
             os.path.join(open_dir, "escape"), f"/var/tmp/spade_escape_{nonce}",
             f"/dev/shm/spade_escape_{nonce}", f"{os.getcwd()}/spade_escape_{nonce}"]
  try:
    h, r = run_one(pool, "hostile_writes", options={"paths": targets})
    assert r.ok, r
    obs, info = r.value
    assert info["home"] == info["cwd"]  # HOME is the scratch dir
    assert info["home"].endswith("home_marker") is False
    for path in targets:
      assert not os.path.exists(path), f"{path} escaped the sandbox: {obs}"
  finally:
    for path in targets:
      if os.path.exists(path):
        os.unlink(path)
    os.rmdir(open_dir) if not os.listdir(open_dir) else None
  assert not os.path.exists(info["home"])  # scratch deleted on release


def test_secrets_never_reach_observations(pool, secret_file):
  _, r = run_one(pool, "hostile_secrets",
                 options={"paths": [secret_file], "trainer_pid": os.getpid()})
  assert r.ok, r
  assert SECRET not in r.value[0]
  assert "SPADE_TEST_SECRET" not in r.value[0]


def test_object_graph_escape_cannot_leak(pool, secret_file):
  marker = f"/tmp/spade_escape_{uuid.uuid4().hex}"
  _, r = run_one(pool, "hostile_object_escape",
                 options={"secret": secret_file, "marker": marker})
  assert SECRET not in str(r.value) and SECRET not in r.detail
  assert not os.path.exists(marker)


def test_network_is_unreachable(pool):
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind(("0.0.0.0", 0))
  listener.listen(4)
  listener.settimeout(0.3)
  host_ip = None
  try:
    host_ip = socket.gethostbyname(socket.gethostname())
  except OSError:
    pass
  try:
    _, r = run_one(pool, "hostile_network", preimport=needs(pool, "socket"),
                   options={"port": listener.getsockname()[1], "host_ip": host_ip})
    assert r.ok and "connected" not in r.value[0], r
    with pytest.raises(socket.timeout):
      listener.accept()
  finally:
    listener.close()


def test_killing_the_parent_fails(pool):
  _, r = run_one(pool, "hostile_kill_parent", options={"trainer_pid": os.getpid()})
  assert r.ok, r
  assert f"{os.getpid()}:killed" not in r.value[0]
  # The pool still serves new envs.
  h = pool.start([builtin_program("grid_walk")])[0]
  assert pool.reset_many([h], seeds=[1])[0].ok
  pool.release([h])


def test_segfault_is_a_crash(pool):
  _, r = run_one(pool, "hostile_segfault")
  assert not r.ok and r.reason == "crash" and "SIGSEGV" in r.detail, r


def test_forged_and_deeply_nested_replies(pool):
  forge = ("import os\nclass ForgeEnv:\n  def __init__(self, max_turns=25):\n    pass\n"
           "  def reset(self, seed=None, options=None):\n    return 'r', {}\n"
           "  def step(self, a):\n"
           "    if a == 'nest':\n      x = []\n      for _ in range(100000):\n        x = [x]\n"
           "      return 'o', 0.0, False, False, {'x': x}\n"
           "    deep = b'[' * 100000 + b']' * 100000\n"
           "    frame = len(deep).to_bytes(4, 'big') + deep\n"
           "    for fd in range(3, 12):\n"
           "      try:\n"
           "        os.write(fd, frame if a == 'deep' else b'\\x00\\x00\\x00\\x05[1,2]xx')\n"
           "      except OSError:\n        pass\n"
           "    return 'o', 0.0, False, False, {}\n")
  for action in ("nest", "forge", "deep"):
    h = pool.start([forge])[0]
    pool.reset_many([h])
    r = pool.step_many([h], [action])[0]
    assert not r.ok and r.reason in ("crash", "contract"), r
    pool.release([h])


def test_huge_observation_and_info(pool):
  _, r = run_one(pool, "hostile_huge_observation", op="step", action="x")
  assert not r.ok and r.reason == "output_too_large", r
  _, r = run_one(pool, "hostile_huge_observation", op="step", action="info")
  assert not r.ok and r.reason == "output_too_large", r


@pytest.mark.parametrize("action", ["nan", "inf", "big", "str"])
def test_bad_rewards_are_contract_breaches(pool, action):
  _, r = run_one(pool, "hostile_nan_reward", op="step", action=action)
  assert not r.ok and r.reason == "contract", r


def test_output_floods_do_not_corrupt_protocol(pool):
  h = pool.start([fixture("hostile_output_flood")])[0]
  r = pool.reset_many([h])[0]
  assert r.ok and r.value[0] == "still fine", r
  r = pool.step_many([h], ["go"])[0]
  assert r.ok and r.value[:2] == ("clean", 0.5), r
  pool.release([h])


def test_lingering_threads_and_children_are_reaped(pool):
  if not pool.plan.drop_uid:
    pytest.skip("finding leftovers by uid needs the per-worker uid (run as root)")
  h = pool.start([fixture("hostile_lingering")], preimport=needs(pool, "threading"))[0]
  r = pool.reset_many([h])[0]
  assert r.ok, r
  spawned = sandbox_pids(pool, h.uid)
  assert len(spawned) >= 3, spawned  # worker + child + detached grandchild
  pool.release([h])
  assert not wait_gone(spawned)


def test_close_kills_everything():
  with EnvPool(dataclasses.replace(TEST_CFG, self_test=False)) as p:
    hs = p.start([fixture("hostile_lingering")] * 2)
    p.reset_many(hs)
    pids = list(p.worker_pids)
    base = p.supply.base
  assert not wait_gone(pids)
  assert not os.path.exists(base)


def test_strict_mode_refuses_without_namespaces():
  cfg = SandboxConfig(mode="strict", use_bwrap=False, use_unshare=False, num_workers=0)
  with pytest.raises(RuntimeError, match="strict"):
    EnvPool(cfg)


def test_unshare_fallback_holds_core_layers():
  cfg = dataclasses.replace(TEST_CFG, use_bwrap=False, num_workers=1)
  with EnvPool(cfg) as p:
    if p.plan.launcher != "unshare":
      pytest.skip("unshare cannot create namespaces here")
    assert p.report.layers["net_namespace"] and p.report.layers["pid_namespace"]
    _, r = run_one(p, "hostile_kill_parent", options={"trainer_pid": os.getpid()})
    assert r.ok and f"{os.getpid()}:killed" not in r.value[0]
    _, r = run_one(p, "hostile_infinite_loop", op="step")
    assert r.reason == "timeout"
    if p.plan.drop_uid:
      # Without a private mount namespace the interpreter prefix may be unreadable
      # after the uid drop, so the modules this program needs are pre-imported.
      h = p.start([fixture("hostile_lingering")],
                  preimport=DEFAULT_PREIMPORT + ("threading",))[0]
      assert p.reset_many([h])[0].ok
      spawned = sandbox_pids(p, h.uid)
      assert len(spawned) >= 3, spawned
      p.release([h])
      assert not wait_gone(spawned)


def test_unshare_fallback_confines_writes_and_secrets(secret_file):
  cfg = dataclasses.replace(TEST_CFG, use_bwrap=False, num_workers=0, self_test=False)
  with EnvPool(cfg) as p:
    if p.plan.launcher != "unshare" or os.geteuid() != 0:
      pytest.skip("needs unshare as root")
    nonce = uuid.uuid4().hex
    targets = [f"/tmp/spade_escape_{nonce}", f"/var/tmp/spade_escape_{nonce}",
               f"/dev/shm/spade_escape_{nonce}", f"/root/spade_escape_{nonce}"]
    _, r = run_one(p, "hostile_writes", options={"paths": targets})
    assert r.ok, r
    assert r.value[0].endswith("home_marker:written"), r.value[0]
    for path in targets:
      assert not os.path.exists(path), r.value[0]
    _, r = run_one(p, "hostile_secrets",
                   options={"paths": [secret_file], "trainer_pid": os.getpid()})
    assert r.ok and SECRET not in r.value[0]


def test_no_namespace_mode_still_contains_basics(caplog):
  cfg = dataclasses.replace(TEST_CFG, mode="none", num_workers=0)
  with caplog.at_level("WARNING"), EnvPool(cfg) as p:
    assert p.plan.launcher == "none"
    assert not p.report.layers["net_namespace"]
    assert "SANDBOX IS WEAKER THAN DESIGNED" in caplog.text
    _, r = run_one(p, "hostile_infinite_loop", op="step")
    assert r.reason == "timeout"
    if p.plan.drop_uid:
      _, r = run_one(p, "hostile_kill_parent", options={"trainer_pid": os.getpid()})
      assert r.ok and f"{os.getpid()}:killed" not in r.value[0]
      h = p.start([fixture("hostile_lingering")],
                  preimport=DEFAULT_PREIMPORT + ("threading",))[0]
      assert p.reset_many([h])[0].ok
      spawned = sandbox_pids(p, h.uid)
      assert len(spawned) >= 3, spawned
      p.release([h])
      assert not wait_gone(spawned)


def test_scratch_is_private_and_capped(pool):
  if pool.plan.launcher != "bwrap":
    pytest.skip("only bubblewrap gives a size-capped scratch dir")
  src = ("import os\nclass DiskEnv:\n  def __init__(self, max_turns=25):\n    pass\n"
         "  def reset(self, seed=None, options=None):\n"
         "    n = 0\n"
         "    try:\n"
         "      for i in range(100):\n"
         "        with open('f%d' % i, 'wb') as f:\n"
         "          f.write(b'x' * (8 << 20))\n"
         "        n += 1\n"
         "    except OSError as e:\n"
         "      return '%d %s' % (n, type(e).__name__), {'cwd': os.getcwd()}\n"
         "    return '%d none' % n, {'cwd': os.getcwd()}\n"
         "  def step(self, a):\n    return '', 0.0, True, False, {}\n")
  _, r = run_one(pool, None, source=src)
  assert r.ok, r
  written = int(r.value[0].split()[0])
  assert written * 8 <= TEST_CFG.scratch_mb and r.value[1]["cwd"] == "/scratch", r.value


def test_broken_launcher_falls_back(monkeypatch, caplog):
  from spade_jax.sandbox import isolation  # pylint: disable=import-outside-toplevel
  real = isolation.worker_command

  def broken(plan, *args, **kwargs):
    argv = real(plan, *args, **kwargs)
    if plan.launcher == "bwrap":
      argv.insert(1, "--no-such-option")
    return argv

  monkeypatch.setattr(isolation, "worker_command", broken)
  cfg = dataclasses.replace(TEST_CFG, num_workers=0)
  with caplog.at_level("WARNING"), EnvPool(cfg) as p:
    if isolation.plan_isolation(cfg).launcher != "bwrap":
      pytest.skip("bubblewrap not in use here")
    assert p.plan.launcher != "bwrap" and "falling back" in caplog.text
    h = p.start([builtin_program("guess_secret")])[0]
    assert p.reset_many([h], seeds=[0])[0].ok
    p.release([h])


# ---- fork server -------------------------------------------------------------------

FORK_CFG = dataclasses.replace(TEST_CFG, fork_server=True, num_workers=1, self_test=False)

# Reports what a forked worker sees of itself and of a sibling worker of the same pool.
SIBLING = r'''
import json, os, random, signal


def _open(fd):
  try:
    os.fstat(fd)
    return True
  except OSError:
    return False


class SiblingEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    o = options or {}
    out = {"uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"),
           "random": random.random()}
    with open("mine.txt", "w") as f:
      f.write("mine")
    def attempt(name, fn):
      try:
        fn()
        out[name] = "ok"
      except Exception as e:
        out[name] = type(e).__name__
    if o.get("other_scratch"):
      attempt("list_other", lambda: os.listdir(o["other_scratch"]))
      attempt("read_other", lambda: open(os.path.join(o["other_scratch"], "mine.txt")).read())
      attempt("write_other", lambda: open(os.path.join(o["other_scratch"], "evil"), "w").close())
    if o.get("other_pid"):
      attempt("kill_other", lambda: os.kill(o["other_pid"], signal.SIGKILL))
    out["fds"] = [fd for fd in range(256) if _open(fd)]
    return json.dumps(out), {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''


@pytest.fixture(scope="module")
def fork_pool():
  with EnvPool(FORK_CFG) as p:
    if p.supply.server is None:
      pytest.skip(f"no fork server on this host: {p.fork_server_note}")
    yield p


def _forked(pool, handles):
  from spade_jax.sandbox.process import ForkedWorker  # pylint: disable=import-outside-toplevel
  return all(isinstance(h._worker, ForkedWorker) for h in handles)  # pylint: disable=protected-access


def test_forked_workers_keep_uid_scratch_and_fds_apart(fork_pool):
  a, b = fork_pool.start([SIBLING, SIBLING])
  try:
    assert a.alive and b.alive and _forked(fork_pool, [a, b]), (a.detail, b.detail)
    ra = fork_pool.reset_many([a], seeds=[0])[0]
    # Under bubblewrap a's files live in its own tmpfs, at /scratch in its own
    # mount namespace; its host scratch path is not even mounted in b's.
    rb = fork_pool.reset_many([b], seeds=[0], options={
        "other_scratch": a._worker.scratch, "other_pid": a.pid})[0]  # pylint: disable=protected-access
    assert ra.ok and rb.ok, (ra, rb)
    fa, fb = json.loads(ra.value[0]), json.loads(rb.value[0])
    if fork_pool.plan.drop_uid:
      assert fa["uid"] == a.uid and fb["uid"] == b.uid and a.uid != b.uid and 0 not in (a.uid, b.uid)
    inside = "/scratch" if fork_pool.plan.launcher == "bwrap" else None
    for f, h in ((fa, a), (fb, b)):
      assert f["cwd"] == f["home"] == (inside or h._worker.scratch), f  # pylint: disable=protected-access
      # stdio (all /dev/null) and the protocol socket: nothing of the fork server's.
      assert len(f["fds"]) == 5 and f["fds"][:3] == [0, 1, 2], f["fds"]
    # Each worker draws its own random stream, not a copy of the fork server's.
    assert fa["random"] != fb["random"]
    for name in ("list_other", "read_other", "write_other", "kill_other"):
      assert fb[name] != "ok", (name, fb)
    assert fork_pool.step_many([a], ["1"])[0].ok  # The sibling survived.
    assert not os.path.exists(os.path.join(a._worker.scratch, "evil"))  # pylint: disable=protected-access
  finally:
    fork_pool.release([a, b])


def test_forked_workers_see_only_scratch_under_private_tmp():
  # Landlock and seccomp off: only the private /tmp of the unshare launcher (as
  # root) stands between a worker and the rest of the pool's base dir.
  cfg = dataclasses.replace(FORK_CFG, use_bwrap=False, landlock=False, seccomp=False,
                            num_workers=0)
  with EnvPool(cfg) as p:
    base = p.supply.base
    if p.plan.launcher != "unshare" or os.geteuid() != 0 or not base.startswith("/tmp/"):
      pytest.skip("needs unshare as root and the pool's base dir under /tmp")
    if p.supply.server is None:
      pytest.skip(f"no fork server on this host: {p.fork_server_note}")
    planted = os.path.join(base, "planted")
    os.mkdir(planted)
    os.chmod(planted, 0o777)
    _, r = run_one(p, "hostile_writes", options={"paths": [os.path.join(planted, "escape")]})
    assert r.ok, r
    assert not r.value[0].splitlines()[0].endswith(":written"), r.value[0]
    assert r.value[0].endswith("home_marker:written"), r.value[0]
    assert os.listdir(planted) == []


def test_forked_worker_deadline_kill(fork_pool):
  for name in ("hostile_infinite_loop", "hostile_ignore_sigterm"):
    h = fork_pool.start([fixture(name)])[0]
    assert _forked(fork_pool, [h])
    pid = h.pid
    assert fork_pool.reset_many([h])[0].ok
    t = time.monotonic()
    r = fork_pool.step_many([h], ["x"])[0]
    assert r.reason == "timeout" and time.monotonic() - t < TEST_CFG.call_timeout_s + 1.0, r
    fork_pool.release([h])
    assert not wait_gone([pid])
  _, r = run_one(fork_pool, "hostile_sleep")
  assert r.reason == "timeout"
  h = fork_pool.start([builtin_program("guess_secret")])[0]  # The pool still serves.
  assert fork_pool.reset_many([h], seeds=[0])[0].ok
  fork_pool.release([h])


def test_forked_worker_network_and_parent(fork_pool):
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind(("0.0.0.0", 0))
  listener.listen(4)
  listener.settimeout(0.3)
  try:
    _, r = run_one(fork_pool, "hostile_network", preimport=needs(fork_pool, "socket"),
                   options={"port": listener.getsockname()[1], "host_ip": None})
    assert r.ok and "connected" not in r.value[0], r
    with pytest.raises(socket.timeout):
      listener.accept()
  finally:
    listener.close()
  _, r = run_one(fork_pool, "hostile_kill_parent", options={"trainer_pid": os.getpid()})
  assert r.ok and f"{os.getpid()}:killed" not in r.value[0], r
  assert fork_pool.supply.server.alive


def test_forked_worker_memory_limit():
  cfg = dataclasses.replace(FORK_CFG, memory_mb=160, call_timeout_s=10.0, num_workers=0)
  with EnvPool(cfg) as p:
    if p.supply.server is None:
      pytest.skip(f"no fork server on this host: {p.fork_server_note}")
    _, r = run_one(p, "hostile_memory_bomb")
    assert not r.ok and r.reason == "memory", r


def test_forked_worker_process_tree_dies_with_it(fork_pool):
  if fork_pool.plan.launcher == "none" and not fork_pool.plan.drop_uid:
    pytest.skip("without namespaces or the uid drop a detached grandchild is not found")
  h = fork_pool.start([fixture("hostile_lingering")],
                      preimport=needs(fork_pool, "threading"))[0]
  assert _forked(fork_pool, [h])
  assert fork_pool.reset_many([h])[0].ok
  spawned = sandbox_pids(fork_pool, h.uid) if fork_pool.plan.drop_uid else []
  assert not fork_pool.plan.drop_uid or len(spawned) >= 3, spawned
  pid = h.pid
  fork_pool.release([h])
  assert not wait_gone(spawned + [pid])
  if fork_pool.plan.drop_uid:
    h = fork_pool.start([fixture("hostile_fork_bomb")])[0]
    uid = h.uid
    r = fork_pool.reset_many([h])[0]
    assert not r.ok and r.reason in ("timeout", "crash")
    assert len(sandbox_pids(fork_pool, uid)) <= TEST_CFG.max_processes
    fork_pool.release([h])
    assert not wait_gone(sandbox_pids(fork_pool, uid))


CAPS = r'''
import ctypes, json, os


class CapsEnv:
  def __init__(self, max_turns=25, **kwargs):
    pass

  def reset(self, seed=None, options=None):
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    rc = libc.capget(header, data)
    return json.dumps({"rc": rc, "caps": list(data), "no_new_privs": libc.prctl(39, 0, 0, 0, 0)}), {}

  def step(self, action):
    return "", 0.0, True, False, {}
'''


@pytest.mark.parametrize("drop_uid", [True, False])
def test_forked_workers_hold_no_capabilities(drop_uid):
  # Under bubblewrap the fork server keeps CAP_SYS_ADMIN to build each worker's
  # namespaces; none of it may reach program code.
  with EnvPool(dataclasses.replace(FORK_CFG, drop_uid=drop_uid, num_workers=0)) as p:
    h = p.start([CAPS], preimport=needs(p, "ctypes"))[0]
    r = p.reset_many([h])[0]
    p.release([h])
  assert r.ok, r
  facts = json.loads(r.value[0])
  assert facts == {"rc": 0, "caps": [0] * 6, "no_new_privs": 1}, facts


def test_self_test_reports_the_same_layers_forked_and_spawned():
  reports = {}
  for fork in (True, False):
    with EnvPool(dataclasses.replace(TEST_CFG, fork_server=fork, num_workers=0)) as p:
      if fork and p.supply.server is None:
        pytest.skip(f"no fork server on this host: {p.fork_server_note}")
      assert ("forked" in p.fork_server_note) == fork, p.fork_server_note
      reports[fork] = p.report
  assert reports[True].layers == reports[False].layers, (reports[True].summary(),
                                                          reports[False].summary())
  assert reports[True].why == reports[False].why


def _kill_server(pool):
  server = pool.supply.server
  os.killpg(server.proc.pid, signal.SIGKILL)
  server.proc.wait(timeout=5)


def test_fork_server_death_restarts_it(caplog):
  with caplog.at_level("WARNING"), EnvPool(FORK_CFG) as p:
    if p.supply.server is None:
      pytest.skip(f"no fork server on this host: {p.fork_server_note}")
    h = p.start([builtin_program("guess_secret")])[0]
    assert p.reset_many([h], seeds=[0])[0].ok
    assert p.wait_ready()
    _kill_server(p)
    if p.plan.launcher != "none":  # Its workers die with it (it holds their namespaces).
      assert not wait_gone([h.pid])
      r = p.step_many([h], ["5"])[0]
      assert not r.ok and r.reason == "crash", r
    p.release([h])
    # The next start skips a warm spare that died with the server, forks from a new one.
    hs = p.start([builtin_program("guess_secret")] * 2)
    assert all(h.alive for h in hs) and _forked(p, hs), [h.detail for h in hs]
    assert all(r.ok for r in p.reset_many(hs, seeds=[0, 1]))
    p.release(hs)
    assert "restarting it" in caplog.text


def test_fork_server_that_keeps_dying_gives_way_to_spawning(monkeypatch, caplog):
  from spade_jax.sandbox import supply  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(supply, "MAX_SERVER_RESTARTS", 0)
  with caplog.at_level("WARNING"), EnvPool(dataclasses.replace(FORK_CFG, num_workers=0)) as p:
    if p.supply.server is None:
      pytest.skip(f"no fork server on this host: {p.fork_server_note}")
    _kill_server(p)
    h = p.start([builtin_program("guess_secret")])[0]
    assert h.alive and not _forked(p, [h]), h.detail
    assert p.reset_many([h], seeds=[0])[0].ok
    p.release([h])
    assert "from now on" in caplog.text and "kept failing" in p.fork_server_note


def test_no_fork_server_starts_workers_one_by_one(monkeypatch, caplog):
  from spade_jax.sandbox import forkserver  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(forkserver, "supported", lambda: (False, "switched off for this test"))
  with caplog.at_level("INFO"), EnvPool(dataclasses.replace(FORK_CFG, num_workers=0)) as p:
    assert "switched off for this test" in p.fork_server_note
    h = p.start([builtin_program("guess_secret")])[0]
    assert h.alive and not _forked(p, [h])
    assert p.reset_many([h], seeds=[0])[0].ok
    p.release([h])
