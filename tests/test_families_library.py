"""Library programs: the families imported by short programs inside the sandbox."""

import dataclasses

import pytest

from spade_jax.envs import ValidationConfig, validate_program
from spade_jax.envs import tools as tools_lib
from spade_jax.envs.families import FAMILIES, NUM_LEVELS, library
from spade_jax.sandbox import EnvPool, SandboxConfig

SANDBOX = SandboxConfig(num_workers=2, call_timeout_s=5.0, load_timeout_s=20.0,
                        self_test=False, modules=("spade_jax.envs.families.library",))
VALIDATION = ValidationConfig(setting="games", require_solution=True, extract=False,
                              allowed_imports=library.PROGRAM_IMPORTS)


@pytest.fixture(scope="module")
def pool():
  with EnvPool(SANDBOX) as p:
    yield p


def _play(pool, sources, seed, turns):
  """Each program's reset, hint, then solution() followed turn by turn: the transcript."""
  handles = tools_lib.start(pool, sources, "games", turns)
  out = [[] for _ in sources]
  try:
    for i, r in enumerate(pool.reset_many(handles, seeds=[seed] * len(handles))):
      assert r.ok, (r.reason, r.detail)
      out[i].append(r.value)
    for i, h in enumerate(pool.call_many(handles, "hint")):
      out[i].append(h.value if h.ok else h.reason)
    live = list(range(len(sources)))
    for _ in range(turns):
      plans = pool.call_many([handles[i] for i in live], "solution")
      acts = [p.value[0] if p.ok and p.value else "0" for p in plans]
      still = []
      for i, a, res in zip(live, acts, pool.step_many([handles[i] for i in live], acts)):
        assert res.ok, (res.reason, res.detail)
        out[i].append((a, res.value[:4]))
        if not (res.value[2] or res.value[3]):
          still.append(i)
      live = still
  finally:
    pool.release(handles)
  return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_library_program_plays_as_the_full_program(name, pool):
  fam = FAMILIES[name]
  for level in (0, NUM_LEVELS - 1):
    lib, full = library.program_at(name, level), fam.program_at(level)
    assert len(lib) < len(full) / 3, (name, len(lib), len(full))
    head = full.split("\n\n", 2)  # title, knob lines
    assert lib.startswith(head[0]) and head[1] in lib
    verdict = validate_program(lib, pool, VALIDATION)
    assert verdict.valid, (name, level, verdict.reason, verdict.detail)
    assert verdict.has_solution and verdict.has_hint
    turns = fam.max_turns(**fam.levels(level))
    a, b = _play(pool, [lib, full], seed=11 + level, turns=turns)
    assert a == b
    assert a[-1][1][1] == 1.0  # solution() wins it


def test_knob_values_reach_the_game(pool):
  easy = library.program("guess_number", HIGH=7, SLACK=3)
  hard = library.program("guess_number", HIGH=1023, SLACK=0)
  obs = [t[0][0] for t in _play(pool, [easy, hard], seed=3, turns=1)]
  assert "from 1 to 7." in obs[0] and "from 1 to 1023." in obs[1]


def test_without_the_module_or_the_allowed_import_it_is_refused(pool):
  src = library.program_at("ordering", 2)
  verdict = validate_program(src, pool, dataclasses.replace(VALIDATION,
                                                            allowed_imports=("random",)))
  assert verdict.reason == "forbidden" and "families" in verdict.detail
  bare = dataclasses.replace(SANDBOX, modules=())
  with EnvPool(bare) as p:
    verdict = validate_program(src, p, VALIDATION)
  assert not verdict.valid and "No module named 'families'" in verdict.detail


def test_wrong_knobs_and_a_step_before_reset_fail_inside_the_sandbox(pool):
  src = library.program_at("guess_number", 2).replace("SLACK=SLACK, ", "")
  handles = tools_lib.start(pool, [src, library.program_at("guess_number", 2)], "games", 8)
  try:
    r = pool.reset_many(handles[:1], seeds=[0])[0]
    assert not r.ok and "takes the knobs" in r.detail
    s = pool.step_many(handles[1:], ["5"])[0]
    assert not s.ok and "reset()" in s.detail
  finally:
    pool.release(handles)


def test_workers_started_one_by_one_build_the_module_too():
  cfg = dataclasses.replace(SANDBOX, fork_server=False, num_workers=1)
  with EnvPool(cfg) as p:
    verdict = validate_program(library.program_at("reach_target", 1), p, VALIDATION)
  assert verdict.valid, (verdict.reason, verdict.detail)


def test_a_bad_modules_entry_fails_at_pool_start():
  with pytest.raises(ValueError, match="sandbox_module"):
    EnvPool(dataclasses.replace(SANDBOX, modules=("spade_jax.envs.contract",)))
