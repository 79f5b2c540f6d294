"""Procedural env families: valid programs, solvable, knobs that set difficulty, hints."""

import random
import re

import pytest

from spade_jax.envs import SETTINGS, ValidationConfig, validate_program
from spade_jax.envs import tools as tools_lib
from spade_jax.envs.families import (FAMILIES, HELD_OUT, LEVEL_NAMES, MEDIUM, NUM_LEVELS,
                                     Family, Knob, by_skill, seen_families)
from spade_jax.envs.families.noisy import noisy_play, noisy_win_rate
from spade_jax.registry import UnknownNameError
from spade_jax.sandbox import EnvPool, SandboxConfig

SANDBOX = SandboxConfig(num_workers=2, call_timeout_s=5.0, load_timeout_s=20.0,
                        self_test=False)
VALIDATION = ValidationConfig(setting="games", require_solution=True, extract=False)
NAMES = list(FAMILIES)
EASIEST, HARDEST = 0, NUM_LEVELS - 1
# Noisy-solver difficulty check: slip probability, seeds and the required win-rate gap
# between the easiest and hardest level (the rates are deterministic given the seeds).
NOISE_P = 0.25
NOISE_SEEDS = range(40)
MIN_GAP = 0.2
MAX_PROGRAM_CHARS = 4500


@pytest.fixture(scope="module")
def pool():
  with EnvPool(SANDBOX) as p:
    yield p


def _start(pool, family: Family, level: int, seeds):
  """Handles of ``family``'s program at ``level``, reset with ``seeds``."""
  handles = tools_lib.start(pool, [family.program_at(level)] * len(seeds), "games",
                            family.max_turns(**family.levels(level)))
  for r in pool.reset_many(handles, seeds=list(seeds)):
    assert r.ok, (family.name, r.reason, r.detail)
  return handles


# ---- rendering and validation -------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_level_renders_a_valid_program(name, pool):
  fam = FAMILIES[name]
  assert fam.skill in SETTINGS["games"].skills
  sources = []
  for level in range(NUM_LEVELS):
    src = fam.program_at(level)
    assert src == fam.program_at(level) == fam.program(**fam.levels(level))
    assert len(src) <= MAX_PROGRAM_CHARS, (name, level, len(src))
    for knob, value in fam.levels(level).items():
      assert f"\n{knob} = {value!r}  # " in src
    assert f"\nTURNS = {fam.max_turns(**fam.levels(level))!r}  # " in src
    assert fam.max_turns(**fam.levels(level)) <= VALIDATION.max_turns
    verdict = validate_program(src, pool, VALIDATION)
    assert verdict.valid, (name, level, verdict.reason, verdict.detail)
    assert verdict.has_solution and verdict.has_hint
    sources.append(src)
  assert len(set(sources)) == NUM_LEVELS  # every level is a different program
  assert fam.program() == fam.program_at(MEDIUM)


@pytest.mark.parametrize("name", NAMES)
def test_knob_levels_are_monotone(name):
  for knob in FAMILIES[name].knobs:
    levels = list(knob.levels)
    assert levels in (sorted(levels), sorted(levels, reverse=True)), (name, knob.name)
    assert len(set(levels)) > 1, (name, knob.name)  # every knob changes with the level


# ---- solution(), the noisy solver and difficulty ------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_solution_wins_at_easiest_and_hardest(name, pool):
  fam = FAMILIES[name]
  for level in (EASIEST, HARDEST):
    won = noisy_play(pool, fam, fam.levels(level), range(6), p=0.0)
    assert all(won), (name, level, won)


# What each family's worked step says about its first planned action (families
# without a worked step write none).
_NUM = r"(-?\d+)"
WORK_CHECKS = {
    "arithmetic_chain": (rf"{_NUM} [-+*] \d+ = {_NUM}",
                         lambda m, a, w: m[2] == a and eval(w.split(" =")[0]) == int(a)),
    "guess_number": (rf"{_NUM} \+ {_NUM} = {_NUM}, {_NUM} / 2 = {_NUM}",
                     lambda m, a, w: (int(m[1]) + int(m[2]) == int(m[3]) == int(m[4])
                                      and int(m[4]) // 2 == int(m[5]) == int(a))),
    "prime_factors": (rf"{_NUM} / {_NUM} = {_NUM}",
                      lambda m, a, w: m[2] == a and int(m[1]) == int(m[2]) * int(m[3])),
    "base_convert": (rf"{_NUM} = {_NUM} \* {_NUM} \+ {_NUM}",
                     lambda m, a, w: (m[2] == a and int(m[1]) == int(m[2]) * int(m[3])
                                      + int(m[4]) and 0 <= int(m[4]) < int(m[3]))),
    "reach_target": (rf"{_NUM} ([-+*]) (\d+) = {_NUM}, target {_NUM}",
                     lambda m, a, w: m[2] + m[3] == a
                     and eval(f"{m[1]} {m[2]} {m[3]}") == int(m[4])),
    "grid_path": (r"P row (\d+) col (\d+), G row (\d+) col (\d+)", lambda m, a, w: True),
    "number_sequence": (rf".*= {_NUM}", lambda m, a, w: m[1] == a),
}


def test_worked_steps_agree_with_the_plan(pool):
  """``work()`` (rendered only with ``worked=True``) states the computation behind the
  plan's first action, on every turn of a plan-following episode at every level."""
  assert set(WORK_CHECKS) <= set(seen_families())
  for name in NAMES:
    fam = FAMILIES[name]
    assert "def work(self)" not in fam.program_at(MEDIUM)  # the designer never sees it
    assert (name in WORK_CHECKS) == bool(fam.work), name
    for level in (EASIEST, MEDIUM, HARDEST):
      knobs = fam.levels(level)
      src = fam.program(worked=True, **knobs)
      assert validate_program(src, pool, VALIDATION).valid, name
      handles = tools_lib.start(pool, [src] * 3, "games", fam.max_turns(**knobs))
      try:
        for r in pool.reset_many(handles, seeds=[0, 1, 2]):
          assert r.ok, (name, r.detail)
        live = list(handles)
        while live:
          plans = pool.call_many(live, "solution")
          works = pool.call_many(live, "work")
          acts = []
          for plan, work in zip(plans, works):
            assert plan.ok and work.ok and isinstance(work.value, str), (name, work.detail)
            act, text = plan.value[0], work.value
            if name in WORK_CHECKS:
              pattern, agrees = WORK_CHECKS[name]
              m = re.fullmatch(pattern, text)
              assert m and agrees(m, act, text), (name, level, text, act)
            else:
              assert text == "", (name, text)
            acts.append("\\boxed{" + act + "}")
          nxt = []
          for h, r in zip(live, pool.step_many(live, acts)):
            assert r.ok, (name, r.detail)
            _, reward, term, trunc, _ = r.value
            if term or trunc:
              assert term and reward == 1.0, (name, level)
            else:
              nxt.append(h)
          live = nxt
      finally:
        pool.release(handles)


@pytest.mark.parametrize("name", NAMES)
def test_difficulty_knobs_lower_the_noisy_win_rate(name, pool):
  fam = FAMILIES[name]
  easy = noisy_win_rate(pool, fam, fam.levels(EASIEST), NOISE_SEEDS, NOISE_P)
  hard = noisy_win_rate(pool, fam, fam.levels(HARDEST), NOISE_SEEDS, NOISE_P)
  assert easy >= hard + MIN_GAP, (name, easy, hard)
  assert easy >= 0.75, (name, easy)  # the easiest level stays winnable through slips


@pytest.mark.parametrize("name", NAMES)
def test_perturb_gives_plausible_strings(name):
  fam = FAMILIES[name]
  knobs = fam.levels(HARDEST)
  rng = random.Random(0)
  for action in ("1", "12", "U", "cat", "Ada", "knight", "+2", "123"):
    out = fam.perturb(rng, action, knobs)
    assert isinstance(out, str) and out, (name, action, out)


# ---- hints ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_hint_helps_without_the_solution(name, pool):
  fam = FAMILIES[name]
  for level in (EASIEST, HARDEST):
    handles = _start(pool, fam, level, range(3))
    try:
      before = pool.call_many(handles, "solution")
      hints = pool.call_many(handles, "hint")
      after = pool.call_many(handles, "solution")
    finally:
      pool.release(handles)
    for b, h, a in zip(before, hints, after):
      assert b.ok and h.ok and a.ok, (name, level, h.detail)
      plan, hint = [str(x) for x in b.value], h.value
      assert a.value == b.value  # hint() leaves the episode alone
      assert isinstance(hint, str) and hint.strip(), (name, level, hint)
      assert len(plan) >= 2, (name, level, plan)
      for sep in ("", " ", ",", ", ", "\n"):
        assert sep.join(plan) not in hint, (name, level, plan, hint)


# ---- registry and knob checks ------------------------------------------------------------


def test_registry():
  assert len(FAMILIES) >= 10
  assert HELD_OUT in FAMILIES
  assert HELD_OUT not in seen_families()
  assert set(seen_families()) == set(FAMILIES) - {HELD_OUT}
  skills = by_skill()
  assert sum(len(v) >= 3 for v in skills.values()) >= 2, skills
  assert all(FAMILIES[n].skill == s for s, names in skills.items() for n in names)
  assert by_skill([HELD_OUT]) == {FAMILIES[HELD_OUT].skill: (HELD_OUT,)}
  for name, fam in FAMILIES.items():
    assert fam.name == name
    assert len(set(fam.knob_names)) == len(fam.knobs)
    assert "TURNS" not in fam.knob_names
  with pytest.raises(UnknownNameError, match="guess_number"):
    FAMILIES["no_such_family"]


@pytest.mark.parametrize("name", NAMES)
def test_bad_knob_values_raise_naming_the_knob(name):
  fam = FAMILIES[name]
  for knob in fam.knobs:
    for bad in (knob.low - 1, knob.high + 1, str(knob.low), float(knob.low), True):
      with pytest.raises(ValueError, match=re.escape(f"{name}.{knob.name}=")):
        fam.program(**{knob.name: bad})
  with pytest.raises(ValueError, match="NOT_A_KNOB"):
    fam.program(NOT_A_KNOB=1)


@pytest.mark.parametrize("name,knobs,why", [
    ("pet_owners", {"PEOPLE": 4, "GIVEN": 4}, "GIVEN must be below PEOPLE"),
    ("grid_path", {"SIZE": 3, "STEPS": 5}, "STEPS must be at most"),
    ("code_breaker", {"LENGTH": 2, "COLORS": 3, "GUESSES": 5}, "GUESSES must be at most"),
])
def test_knob_combinations_are_checked(name, knobs, why):
  with pytest.raises(ValueError, match=why):
    FAMILIES[name].program(**knobs)


# ---- base.Knob and Family.levels ---------------------------------------------------------


def test_knob_errors():
  with pytest.raises(ValueError, match="upper-case identifier"):
    Knob("size", (1, 2, 3, 4, 5), 1, 5, "")
  with pytest.raises(ValueError, match="has 3 levels; expected 5"):
    Knob("SIZE", (1, 2, 3), 1, 5, "")
  with pytest.raises(ValueError, match=r"levels \(1, 2, 3, 4, 9\) leave \[1, 5\]"):
    Knob("SIZE", (1, 2, 3, 4, 9), 1, 5, "")


def test_family_levels():
  fam = FAMILIES["guess_number"]
  assert fam.levels() == fam.levels(MEDIUM) == fam.levels(LEVEL_NAMES[MEDIUM])
  assert fam.levels("hardest") == fam.levels(NUM_LEVELS - 1)
  for bad in ("extreme", NUM_LEVELS, -1, True, 1.0):
    with pytest.raises(ValueError, match="level"):
      fam.levels(bad)
  with pytest.raises(ValueError, match="expected one of"):
    fam.levels("extreme")


def test_held_out_family_speaks_the_seen_families_vocabulary(pool):
  """The held-out family answers with names the seen ``ordering`` family uses, its sums are
  ``arithmetic_chain``-sized, and a plan-following player wins it at every level."""
  assert HELD_OUT == "coin_ledger"
  assert "knights_knaves" in seen_families()
  fam, ordering = FAMILIES[HELD_OUT], FAMILIES["ordering"]
  names = set(re.search(r"NAMES = (\(.*?\))", ordering.program_at(HARDEST)).group(1)
              .replace("'", "").strip("()").replace(" ", "").split(","))
  largest_operand = FAMILIES["arithmetic_chain"].levels(HARDEST)["MAX_OPERAND"]
  for level in range(NUM_LEVELS):
    assert fam.levels(level)["MAX_AMOUNT"] <= largest_operand
    handles = _start(pool, fam, level, range(4))
    try:
      for plan in pool.call_many(handles, "solution"):
        assert plan.ok and set(plan.value) <= names, (level, plan.value)
        assert len(plan.value) == fam.levels(level)["PEOPLE"]
    finally:
      pool.release(handles)
    assert all(noisy_play(pool, fam, fam.levels(level), range(4), p=0.0)), level
