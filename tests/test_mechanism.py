"""The mechanism experiment: configs, warm start (build, resume, refusal), one arm, report."""

import json
import os
import pathlib
import random

import numpy as np
import pytest
from safetensors.numpy import save_file

from experiments.configs import mechanism as configs
from experiments.mechanism import common, data, report, run, warm_start
from spade_jax import models, sandbox
from spade_jax.eval import answers
from spade_jax.selfplay import build as builder, loop
from spade_jax.envs.families import FAMILIES, NUM_LEVELS, library


def _flat(d, prefix=""):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def test_arm_configs_differ_only_where_the_arm_says():
  base = _flat(configs.get_config("arm=spade,seed=1").to_dict())
  want = {"static": {"selfplay.env_source", "static_pool.path"},
          "solve_rate": {"rewards.variant"}, "frozen_designer": {"selfplay.train_designer"}}
  for arm, keys in want.items():
    other = _flat(configs.get_config(f"arm={arm},seed=1").to_dict())
    differ = {k for k in set(base) | set(other) if base.get(k) != other.get(k)}
    assert differ == keys, (arm, differ)
  c = configs.get_config("arm=spade,seed=1")
  # The same agent budget for every arm, evaluation at start and every few iterations.
  assert (c.selfplay.num_envs, c.selfplay.plays, c.selfplay.hinted_plays) == (4, 4, 2)
  assert not c.eval.at_start and c.eval.every == 10 and c.eval.overrides.families.greedy
  assert configs.get_config("arm=spade,shared_start=False").eval.at_start
  items = c.eval.overrides.families.families.split(",")
  assert [i for i in items if i.startswith(common.HELD_OUT)] == [
      f"{common.HELD_OUT}:{lv}" for lv in common.HELD_OUT_LEVELS]
  assert {i for i in items if not i.startswith(common.HELD_OUT)} == {
      f"{n}:{lv}" for n in common.seen()
      for lv in (common.DESIGNER_LEVEL, common.HARDER_LEVEL)}
  assert common.DESIGNER_LEVEL < common.HARDER_LEVEL
  assert configs.get_config("arm=static,iterations=7,eval_every=2").iterations == 7
  assert c.loss.aggregation == "token_mean"
  assert configs.get_config("arm=static,aggregation=seq_mean_token_mean").loss.aggregation \
      == "seq_mean_token_mean"
  assert not c.selfplay.shuffle_agent_advantages
  assert configs.get_config("arm=static,shuffle=True").selfplay.shuffle_agent_advantages
  with pytest.raises(ValueError, match="Unknown aggregation 'seq'"):
    configs.get_config("arm=static,aggregation=seq")
  with pytest.raises(ValueError, match="arm"):
    configs.get_config("arm=nope")
  with pytest.raises(ValueError, match="Unknown config argument"):
    configs.get_config("arm=spade,nope=1")
  with pytest.raises(ValueError, match="Unknown arm"):  # before any warm start is built
    run.run_all(["spade", "warm_start"], [0])


@pytest.mark.parametrize("programs", data.PROGRAMS)
def test_static_pool_holds_every_seen_family_at_every_level(programs):
  with open(configs.static_pool_path(programs)) as f:
    rows = [json.loads(line) for line in f]
  ids = [r["id"] for r in rows]
  assert ids == [f"{n}:{lv}" for n in common.seen() for lv in range(NUM_LEVELS)]
  assert not any(i.startswith(common.HELD_OUT) for i in ids)
  imports = ["from families import" in r["program"] for r in rows]
  assert all(imports) if programs == "library" else not any(imports)
  for r in rows:  # the report reads family and level back from either form
    name, lv = r["id"].split(":")
    assert common.family_of(r["program"]) == (name, pytest.approx(int(lv), abs=1.0))
    if programs == "library":  # a reworded title: the import still names the family
      reworded = '"""A game of my own."""' + r["program"].lstrip().split('"""', 2)[2]
      assert common.family_of(reworded)[0] == name
  assert common.family_of('"""A game."""\nimport random\n') == (None, None)


def test_the_static_pool_can_stop_at_a_level():
  with open(configs.static_pool_path("library", max_level=1)) as f:
    ids = [json.loads(line)["id"] for line in f]
  assert ids == [f"{n}:{lv}" for n in common.seen() for lv in (0, 1)]
  cfg = configs.get_config("arm=static,pool_max_level=1")
  assert cfg.static_pool.path == configs.static_pool_path("library", 1)
  assert cfg.static_pool.path != configs.get_config("arm=static").static_pool.path
  with pytest.raises(ValueError, match="pool_max_level=5"):
    configs.static_pool_path("library", max_level=NUM_LEVELS)
  with pytest.raises(ValueError, match="lower-case"):
    run.run("static", 0, tag="Easy-1")


def test_the_static_pool_can_allow_no_wrong_answers():
  with open(configs.static_pool_path("library", max_level=1)) as f:
    own = [json.loads(line) for line in f]
  with open(configs.static_pool_path("library", max_level=1, slack=0)) as f:
    none = [json.loads(line) for line in f]
  assert [r["id"] for r in none] == [r["id"] for r in own]
  for r, o in zip(none, own):
    name, level = r["id"].split(":")
    assert "\nSLACK = 0  #" in r["program"]
    assert f"\nSLACK = {FAMILIES[name].levels(int(level))['SLACK']}  #" in o["program"]
    turns = FAMILIES[name].max_turns(**{**FAMILIES[name].levels(int(level)), "SLACK": 0})
    assert f"\nTURNS = {turns}  #" in r["program"]
  cfg = configs.get_config("arm=static,pool_max_level=1,pool_slack=0")
  assert cfg.static_pool.path == configs.static_pool_path("library", 1, 0)
  assert cfg.static_pool.path != configs.get_config("arm=static,pool_max_level=1"
                                                    ).static_pool.path
  with pytest.raises(ValueError, match="pool_slack=-2"):
    configs.static_pool_path("library", slack=-2)
  with pytest.raises(ValueError, match="SLACK=7"):
    configs.static_pool_path("library", slack=7)


def test_library_programs_are_the_default_and_run_where_the_arms_run():
  for arm in ("warm_start",) + common.ARMS:
    c = configs.get_config(f"arm={arm}")
    assert c.sandbox.modules == (library.__name__,)
    assert "families" in c.validation.allowed_imports
    assert c.selfplay.designer_new_tokens == common.DESIGNER_NEW_TOKENS["library"]
  full = configs.get_config("arm=spade,programs=full")
  assert full.sandbox.modules == () and "allowed_imports" not in full.validation
  assert full.selfplay.designer_new_tokens == common.DESIGNER_NEW_TOKENS["full"]
  with pytest.raises(ValueError, match="programs"):
    configs.get_config("arm=spade,programs=short")


def test_warm_start_config_is_sft_from_smollm2_and_the_longest_program_fits():
  c = configs.get_config("arm=warm_start")
  assert c.train.objective == "sft" and c.model.init_from == common.BASE
  run_cfg, sft = warm_start.split(c)
  assert "sft" not in run_cfg and sft["designer_rows"] > 0
  assert run_cfg.train.objective == "sft" and run_cfg.loss.kl_coef == 0.0
  _, hf = models.resolve_checkpoint(common.BASE)
  vocab = models.HFTokenizer(hf)
  for programs, budget in common.DESIGNER_NEW_TOKENS.items():
    longest = max(len(vocab.encode(data.designer_reply(data.render(programs, f, knobs))))
                  for f in FAMILIES.values() for knobs in _extremes(f))
    assert longest + 1 <= budget, (programs, longest)


def test_designer_rows_draw_knobs_from_the_designers_levels():
  """The warm start's designer writes mostly the designers' level (`DESIGNER_KNOB_LEVELS`):
  each knob takes the value of a level drawn from them; without levels, any level's."""
  levels = configs.get_config("arm=warm_start").sft.designer_levels
  assert tuple(levels) == common.DESIGNER_KNOB_LEVELS
  assert common.DESIGNER_LEVEL == min(levels)
  rng = random.Random(0)
  for fam in FAMILIES.values():
    for _ in range(5):
      knobs = data.random_knobs(fam, rng, levels)
      assert all(knobs[k.name] in {k.levels[lv] for lv in levels} for k in fam.knobs), (
          fam.name, knobs)
  anywhere = {data.random_knobs(FAMILIES["ordering"], rng)["PEOPLE"] for _ in range(200)}
  assert anywhere == set(FAMILIES["ordering"].knobs[0].levels)
  with pytest.raises(ValueError, match="difficulty levels"):
    data.random_knobs(FAMILIES["ordering"], rng, (0, NUM_LEVELS))


def test_agent_rows_train_the_plan_and_keep_slips_as_context():
  """A slip (an action off the plan) is context unless ``train_slips``; the plan's turns
  (worked step, box, end of turn) are trained either way, on the same episodes."""
  _, hf = models.resolve_checkpoint(common.BASE)
  chat = models.ChatTemplate(models.HFTokenizer(hf), thinking=False)
  kw = dict(families=("arithmetic_chain",), levels=(2,), p=0.5, p_hinted=0.5,
            hinted_frac=0.0, max_turns=common.MAX_TURNS, worked=True)
  with sandbox.EnvPool(sandbox.SandboxConfig(num_workers=2)) as pool:
    ctx = data.agent_examples(pool, chat, 4, 0, **kw)
    both = data.agent_examples(pool, chat, 4, 0, train_slips=True, **kw)
  assert [r.tokens for r in ctx] == [r.tokens for r in both]
  assert sum(r.meta["slips"] for r in ctx) > 0
  eos = chat.vocab.eos_id
  for r, b in zip(ctx, both):
    trained = [t for t, m in zip(r.tokens, r.mask) if m]
    assert trained.count(eos) == r.meta["turns"] - r.meta["slips"]
    assert sum(b.mask) > sum(r.mask) or r.meta["slips"] == 0
    # Every trained turn follows the plan: the family's worked step before its box.
    turns, cur = [], []
    for t in trained:
      cur.append(t)
      if t == eos:
        turns.append(chat.vocab.decode(cur))
        cur = []
    # (arithmetic_chain's step is "a op b = value", then the box of that value)
    assert all(f" = {answers.last_boxed(t)} " in t for t in turns), turns


def _extremes(fam):
  """Knob values at every level, and each knob at its widest allowed value."""
  yield from (fam.levels(lv) for lv in range(NUM_LEVELS))
  for k in fam.knobs:
    try:
      yield fam.resolve(**{k.name: k.high})
    except ValueError:
      continue


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """A fresh cache for the module: tiny checkpoint, SFT rows, warm start, runs."""
  root = tmp_path_factory.mktemp("mech_cache")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("SPADE_JAX_CACHE", str(root))
    yield root


@pytest.fixture(scope="module")
def built(cache):
  """The smoke warm start: one step, then resumed to two (the cache's build)."""
  first = warm_start.build("steps=1", smoke=True, measure=False)
  second = warm_start.build("", smoke=True)
  return first, second


def test_warm_start_builds_resumes_and_refuses_another_config(built, tmp_path):
  first, second = built
  out = common.warm_start_dir(smoke=True)
  assert first["steps"] == 1 and second["steps"] == 2 and first["levels"] is None
  assert second["sha256"] == common.weights_digest(os.path.join(out, "hf")) != first["sha256"]
  with open(os.path.join(out, "metrics.jsonl")) as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2]
  assert second["rows"]["designer"] == 2 and second["rows"]["agent"] == 4
  assert os.listdir(os.path.join(common.cache_dir(), "sft_rows"))  # built once, cached
  agent = second["levels"]["agent"]
  assert {"seen_medium/success", "held_out/success", "held_out/greedy"} <= set(agent)
  assert second["levels"]["designer"]["designs"] == 1
  # Read back, not rebuilt.
  assert warm_start.build("", smoke=True) == second
  # Resuming gives the weights of an uninterrupted build (same batches, same state).
  fresh = warm_start.build("", out=str(tmp_path / "fresh"), smoke=True, measure=False)
  assert fresh["sha256"] == second["sha256"]
  with pytest.raises(ValueError, match="different config"):
    warm_start.build("sft_lr=0.001", smoke=True)
  # A rebuild that makes the weights a results record holds reads its levels back; other
  # weights are measured.
  res = tmp_path / "results"
  res.mkdir()
  kept = {"agent": {"kept": 1.0}, "designer": {"kept": 1.0}}
  (res / "warm_start.json").write_text(json.dumps({**fresh, "levels": kept}))
  os.remove(tmp_path / "fresh" / "warm_start.json")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(warm_start, "levels", lambda *a, **k: pytest.fail("measured again"))
    again = warm_start.build("", out=str(tmp_path / "fresh"), smoke=True, results=str(res))
  assert again["levels"] == kept and again["sha256"] == fresh["sha256"]
  # Other bits of the same model (a rebuild on another CPU): read back too.
  (res / "warm_start.json").write_text(json.dumps({**fresh, "sha256": "0" * 64,
                                                    "levels": kept}))
  os.remove(tmp_path / "fresh" / "warm_start.json")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(warm_start, "levels", lambda *a, **k: pytest.fail("measured again"))
    assert warm_start.build("", out=str(tmp_path / "fresh"), smoke=True,
                            results=str(res))["levels"] == kept
  (res / "warm_start.json").write_text(json.dumps({**fresh, "sha256": "0" * 64,
                                                    "fingerprint": None, "levels": kept}))
  os.remove(tmp_path / "fresh" / "warm_start.json")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(warm_start, "levels", lambda *a, **k: {"agent": {}, "designer": {}})
    measured = warm_start.build("", out=str(tmp_path / "fresh"), smoke=True,
                                results=str(res))
  assert measured["levels"] == {"agent": {}, "designer": {}}
  # How the finished build is measured is not what it is: other items read it back.
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(configs, "starting_items", lambda: "ordering:1")
    assert warm_start.build("", smoke=True) == second


def test_an_arm_runs_one_iteration_and_refuses_other_weights(built, tmp_path):
  _, ws = built
  path = run.run("spade", 0, smoke=True, root=str(tmp_path / "runs"),
                 results=str(tmp_path / "results"))
  with open(path) as f:
    rec = json.load(f)
  assert rec["warm_start"]["sha256"] == ws["sha256"]
  assert rec["arm"] == "spade" and rec["iterations"] == 1
  assert [p["step"] for p in rec["curve"]] == [0, 1]
  assert {"held_out", "held_out@k", "held_out_greedy"} <= set(rec["curve"][0])
  # Step 0 is the shared evaluation of the warm start, equal to the run's own at its start.
  shared = json.loads((tmp_path / "results" / "start_eval.json").read_text())
  assert rec["curve"][0]["shared"] and shared["sha256"] == ws["sha256"]
  own_cfg = configs.get_config("arm=spade,seed=0,smoke,shared_start=False")
  own_run = builder.build_run(own_cfg)
  with sandbox.EnvPool(own_run.config.sandbox) as pool:
    sp = own_run.selfplay(pool, str(tmp_path / "own"))
    own = loop.evaluate_policy(sp, own_run.config.eval, pool)
  assert own == shared["scores"]
  assert run.start_eval(smoke=True, results=str(tmp_path / "results")) == shared  # read back
  assert rec["series"]["designer/valid_rate"]
  # A finished run is read back, not rerun, even where today's config differs from its own.
  before = pathlib.Path(path).stat().st_mtime_ns
  assert run.run("spade", 0, args="lr=3e-5", smoke=True, root=str(tmp_path / "runs"),
                 results=str(tmp_path / "results")) == path
  assert pathlib.Path(path).stat().st_mtime_ns == before
  marker = tmp_path / "runs" / "spade-0" / "warm_start.json"
  # A rebuild on another CPU (other bits, the same model by its fingerprint) goes on.
  fp = json.loads(marker.read_text())["fingerprint"]
  marker.write_text(json.dumps({"sha256": "0" * 64, "fingerprint": fp, "hf": "elsewhere"}))
  assert run.run("spade", 0, smoke=True, root=str(tmp_path / "runs"),
                 results=str(tmp_path / "results")) == path
  moved = {k: [m, r, p + 1e-3] for k, (m, r, p) in fp.items()}
  marker.write_text(json.dumps({"sha256": "0" * 64, "fingerprint": moved, "hf": "x"}))
  with pytest.raises(ValueError, match="other weights"):
    run.run("spade", 0, smoke=True, root=str(tmp_path / "runs"),
            results=str(tmp_path / "results"))
  marker.write_text(json.dumps({"sha256": "0" * 64, "hf": "elsewhere"}))
  with pytest.raises(ValueError, match="other weights"):
    run.run("spade", 0, smoke=True, root=str(tmp_path / "runs"),
            results=str(tmp_path / "results"))


def test_a_fingerprint_tells_rounding_from_training(tmp_path):
  rng = np.random.default_rng(0)
  w = {"a.weight": rng.normal(0, 0.05, (64, 32)).astype(np.float32),
       "b.weight": (1 + rng.normal(0, 0.01, (32,))).astype(np.float32)}

  def saved(name, tensors):
    d = tmp_path / name
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    return str(d)

  base = saved("base", w)
  # Rounding: every element moved by ~1e-7 of itself (other bits, other SHA-256).
  rounded = saved("rounded", {k: v * (1 + rng.normal(0, 1e-7, v.shape)).astype(np.float32)
                              for k, v in w.items()})
  # Training: an SFT-sized step, ~1e-4 absolute, on every element of one tensor.
  stepped = saved("stepped", {**w, "a.weight": w["a.weight"] +
                              rng.normal(0, 1e-4, (64, 32)).astype(np.float32)})
  fp = {n: common.weights_fingerprint(d) for n, d in (("b", base), ("r", rounded),
                                                       ("s", stepped))}
  assert common.weights_digest(base) != common.weights_digest(rounded)
  assert common.same_weights(fp["b"], fp["r"]) and common.same_weights(fp["b"], fp["b"])
  assert not common.same_weights(fp["b"], fp["s"])
  assert not common.same_weights(None, fp["b"]) and not common.same_weights(fp["b"], {})
  assert common.weights_fingerprint(base) == fp["b"]  # a pure function of the weights


def _result(arm, seed, start, end, band):
  curve = [{"step": 0, **{k: start for k in report.SCORES}},
           {"step": 10, **{k: end for k in report.SCORES}}]
  return {"arm": arm, "seed": seed, "iterations": 10, "curve": curve,
          "series": {"designer/valid_rate": [[1, 0.9]],
                     "rewards/win_rate_band_frac": [[1, band], [2, band]],
                     # Step 2 trained no row: its zero loss is not an update's push.
                     "train/loss": [[1, 0.1], [2, 0.0], [3, -0.3]],
                     "batch/loss_tokens": [[1, 300], [2, 0], [3, 200]]},
          "warm_start": {"sha256": "a" * 64},
          "designed": [] if arm == "static" else [
              {"iteration": 1, "family": "ordering", "level": 0.0, "verdict": "valid",
               "nohint": 0.5, "hint": 1.0, "count": 3},
              {"iteration": 2, "family": "grid_path", "level": 1.0, "verdict": "valid",
               "nohint": 0.0, "hint": 0.0, "count": 1},
              {"iteration": 2, "family": None, "level": None, "verdict": "crash",
               "nohint": 0.0, "hint": 0.0, "count": 1}],
          **({} if arm == "static" else {"design_signal": {"samples": 5, "with_gradient": 2}})}


def test_report_recomputes_tables_plots_and_the_readme(tmp_path):
  for arm, gain in (("spade", 0.3), ("static", 0.1)):
    for seed, noise in enumerate((0.0, 0.02, -0.02)):
      (tmp_path / f"{arm}-{seed}.json").write_text(json.dumps(
          _result(arm, seed, 0.2, 0.2 + gain + noise, 0.5 if arm == "spade" else 0.3)))
  # A tagged variant of an arm is a row of its own, after the arm's.
  (tmp_path / "static-0-easy.json").write_text(json.dumps(
      {**_result("static", 0, 0.2, 0.6, 0.4), "tag": "easy"}))
  (tmp_path / "static-0-easy_lr_shuffled.json").write_text(json.dumps(
      {**_result("static", 0, 0.2, 0.1, 0.4), "tag": "easy_lr_shuffled"}))
  readme = tmp_path / "README.md"
  readme.write_text("top\n<!-- report:table -->\nold\n<!-- /report:table -->\nmiddle\n"
                    "<!-- report:contrasts -->\n<!-- /report:contrasts -->\n"
                    "<!-- report:designers -->\n<!-- /report:designers -->\n"
                    "<!-- report:learner -->\n<!-- /report:learner -->\nend\n")
  variants = tmp_path / "LEARNER.md"
  variants.write_text("".join(f"<!-- report:{n} -->\n<!-- /report:{n} -->\n"
                              for n in ("table", "contrasts", "designers", "learner")))
  out = report.report(str(tmp_path), str(readme), str(variants))
  # The README holds the arms' own runs; the variants document the variants and the runs
  # of the arm they vary (not the other arms'), compared with their parents only.
  var = out["variants"]
  assert "[easy" not in readme.read_text() and "[easy" not in out["contrasts"]
  assert "| static | 3 |" in var["table"] and "| spade |" not in var["table"]
  assert "| static [easy] | 1 |" in var["table"] and var["table"] in variants.read_text()
  assert var["learner"] in variants.read_text() and "| spade" not in variants.read_text()
  assert "| static [easy] - static [easy_lr_shuffled] |" in var["contrasts"]
  assert "| spade - static |" not in var["contrasts"]
  # Pooled over 3 runs: 15 written, 12 valid (9 ordering at 0.5 unhinted, 3 grid_path at 0).
  # 2 of each run's 5 scored designer samples had a nonzero centred reward.
  assert "| spade | 3 | 15 | 12 | ordering 75%, grid_path 25% | 0.375 | 0.750 | 6 of 15 |" \
      in out["designers"]
  assert "| static |" not in out["designers"] and out["designers"] in readme.read_text()
  # Two updates with rows a run, one pushing down (loss > 0): mean loss (0.1 - 0.3) / 2.
  assert "| spade | 3 | 6 | 3 of 6 | -0.100 ± 0.000 | 500 |" in out["learner"]
  assert out["learner"] in readme.read_text()
  assert "| spade | 3 |" in out["table"] and "| static | 3 |" in out["table"]
  assert var["table"].index("| static | 3 |") < var["table"].index("| static [easy] | 1 |")
  # A variant is compared with its parent only: the arm, or the variant it extends.
  assert "| static - static [easy] |" in var["contrasts"]
  assert "| static [easy] - static [easy_lr_shuffled] |" in var["contrasts"]
  assert "| static - static [easy_lr_shuffled] |" not in var["contrasts"]
  assert len(out["contrasts"].splitlines()) == 2 + 1
  assert len(var["contrasts"].splitlines()) == 2 + 2
  labels = ["spade", "static", "static [a]", "static [a_b]", "static [a_b_c]", "spade [x_y]"]
  assert [report.parent(x, labels) for x in labels] == \
      [None, None, "static", "static [a]", "static [a_b]", "spade"]
  assert report.parent("solve_rate [x]", labels) is None
  assert "0.500 ± 0.050 (+0.300 ± 0.050)" in out["table"]
  [row] = [r for r in out["contrasts"].splitlines() if r.startswith("| spade - static |")]
  # Paired by seed: every seed's gain differs by exactly 0.2, as does its band share.
  assert row.startswith("| spade - static | 3 paired |")
  assert row.count("+0.200 ± 0.000") == len(report.SCORES) + 1
  # Unpaired (pooled variance) where the seeds differ: one easy run against three.
  [row] = [r for r in var["contrasts"].splitlines() if r.startswith("| static - static [")]
  assert row.startswith("| static - static [easy] | 3 vs 1 | -0.300 |")
  # Lists are unpaired: both variances 1, so a half-width of t(4) * sqrt(1/3 + 1/3); the
  # same values as seed dicts are paired: every difference is 1, no spread.
  assert report.contrast([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == \
      pytest.approx((1.0, 2.776 * (2 / 3) ** 0.5, 4), rel=1e-3)
  assert report.contrast({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.0}) == (1.0, 0.0, 2)
  text = readme.read_text()
  assert "old" not in text and out["table"] in text and out["contrasts"] in text
  assert text.startswith("top\n") and text.endswith("end\n")
  assert all(os.path.getsize(p) > 1000 for p in out["plots"])
  m, ci, n = report.mean_ci([1.0, 2.0, 3.0])
  assert (m, n) == (2.0, 3) and ci == pytest.approx(4.303 / 3 ** 0.5)
  with pytest.raises(FileNotFoundError, match="experiments.mechanism.run"):
    report.report(str(tmp_path / "empty"))


def test_design_signal_counts_samples_with_a_nonzero_centred_reward(tmp_path):
  rows = [{"step": 1, "reward": 0.8}, {"step": 1, "reward": -0.8}, {"step": 2, "reward": 0.0},
          {"step": 2, "reward": 1e-9}, {"step": 2, "skill": "no reward: not scored"}]
  (tmp_path / "designer_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert report.design_signal(str(tmp_path)) == {"samples": 4, "with_gradient": 2}
  assert report.design_signal(str(tmp_path / "none")) == {"samples": 0, "with_gradient": 0}


def test_curve_scores_read_the_families_suite():
  d, h = common.DESIGNER_LEVEL, common.HARDER_LEVEL
  row = {f"eval/families/success/ordering/{d}": 0.5,
         f"eval/families/success/guess_number/{d}": 1.0,
         f"eval/families/success/ordering/{h}": 0.25,
         f"eval/families/success/{common.HELD_OUT}/0": 0.0,
         f"eval/families/success/{common.HELD_OUT}/2": 1.0,
         f"eval/families/pass@k/{common.HELD_OUT}/2": 1.0,
         f"eval/families/greedy/ordering/{d}": 1.0, "agent/reward_nohint": 0.3}
  assert report.scores(row) == {"seen_medium": 0.75, "seen_harder": 0.25, "held_out": 0.5,
                                "held_out@k": 1.0, "seen_medium_greedy": 1.0}
