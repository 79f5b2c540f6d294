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
  c = fs.get_config(3, 30, hf="/x/hf", at_start=False)
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
