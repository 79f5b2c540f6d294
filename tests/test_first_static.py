"""The first experiment's static arm rerun: its warm start, pool, config and score."""

import json
import subprocess

import pytest

from experiments.configs import common as recipes
from experiments.mechanism import common, first_static as fs
from spade_jax.envs.families import FAMILIES


def _has_history() -> bool:
  return subprocess.run(["git", "-C", recipes.REPO, "cat-file", "-e", fs.FIRST_REV],
                        capture_output=True, check=False).returncode == 0


def test_config_is_the_first_arm_on_todays_static_config(tmp_path, monkeypatch):
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
  c = fs.get_config(3, 30, hf="/x/hf")
  assert c.model.init_from == "hf:/x/hf" and c.seed == 3 and c.iterations == 30
  assert c.optimizer.learning_rate == 5e-5 and c.selfplay.env_source == "static_pool"
  assert (c.selfplay.num_envs, c.selfplay.plays, c.selfplay.hinted_plays) == (8, 4, 4)
  assert c.eval.every == 30 and not c.eval.at_start
  fam = c.eval.overrides.families
  assert fam.temperature == 0.0 and fam.samples == 1 and fam.seeds == 16
  assert fam.families.count(":1-2") == len(fs.FIRST_FAMILIES) == 10
  with open(c.static_pool.path) as f:
    rows = [json.loads(line) for line in f]
  assert {r["id"] for r in rows} == {f"{n}:{lv}" for n in fs.FIRST_FAMILIES for lv in range(5)}
  assert rows[0]["program"] == FAMILIES[fs.FIRST_FAMILIES[0]].program_at(0)
  assert common.HELD_OUT not in fs.FIRST_FAMILIES and "knights_knaves" not in fs.FIRST_FAMILIES


def test_levels_score_needs_every_item():
  point = {f"success/{n}/{lv}": 0.5 for n in fs.FIRST_FAMILIES for lv in fs.LEVELS}
  point["success/ordering/2"] = 0.0
  assert fs.levels_score(point) == pytest.approx((19 * 0.5) / 20)
  del point["success/grid_path/1"]
  assert fs.levels_score(point) is None


@pytest.mark.skipif(not _has_history(), reason="a clone without the first experiment's history")
def test_restore_brings_back_the_first_warm_start_by_digest(tmp_path):
  hf = fs.restore(str(tmp_path / "hf"))
  assert common.weights_digest(hf) == fs.FIRST_SHA256
  with open(tmp_path / "hf" / "config.json") as f:
    assert json.load(f)["hidden_size"] == 320
  (tmp_path / "hf" / "model.safetensors").write_bytes(b"not these weights")
  assert fs.restore(hf) == hf and common.weights_digest(hf) == fs.FIRST_SHA256


def test_repeats_counts_answers_a_play_already_gave():
  records = [{"family": "ordering", "actions": ["\\boxed{Cy}", "x \\boxed{Di}", "\\boxed{Di}",
                                                "\\boxed{Cy}"]},
             {"family": "ordering", "actions": ["\\boxed{Bo}"]},
             {"family": "guess_number", "actions": ["7", "7 ", "3 \\boxed{8}"]}]
  got = fs.repeats(records)
  assert got["ordering"] == pytest.approx(2 / 3)  # Di and Cy again, of 3 later answers
  assert got["guess_number"] == pytest.approx(1 / 2)  # "7" twice; "8" is new
  assert got["all"] == pytest.approx(3 / 5)


def test_table_reads_every_record(tmp_path):
  m = lambda v, r: {"levels_1_2": v, "repeats": {f: r for f in fs.ENUMERATED}}
  for name, settings, ends in (("static_rerun.json", [], [0.5, 0.8]),
                               ("static_rerun-x.json", ["loss.aggregation=x"], [0.7])):
    gain = [e - 0.55 for e in ends]
    (tmp_path / name).write_text(json.dumps({
        "settings": settings, "start": m(0.55, 0.2),
        "runs": {str(i): m(e, 0.4) for i, e in enumerate(ends)},
        "end": {"mean": sum(ends) / len(ends), "n": len(ends), "per_seed": ends},
        "gain": {"mean": sum(gain) / len(gain), "ci95": 0.1 if len(ends) > 1 else float("nan")}}))
  (tmp_path / "static-0.json").write_text("{}")  # not a rerun record
  rows = fs.table(str(tmp_path)).splitlines()
  assert len(rows) == 4
  assert "`loss.aggregation=x`" in rows[2] and "0.550 -> 0.700 (0.700) | +0.150 |" in rows[2]
  assert "0.550 -> 0.650 (0.500, 0.800) | +0.100 ± 0.100 | 0.20 -> 0.40, 0.40 |" in rows[3]
