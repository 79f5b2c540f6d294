"""Rows with a zero advantage are left out of the update, which stays the whole batch's."""

import jax
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer, sequence_denominator
from spade_jax.selfplay.batch import Row, loss_tokens
from spade_jax.selfplay.stages.train import train

CFG = get_preset("tiny")
T = 96
ADAM = OptimizerConfig(learning_rate=1e-3)  # AdamW: a zero gradient still moves weights


def _rows(seed=0, uniform=(0, 2), groups=3, plays=4):
  """`groups` groups of `plays` plays sharing a prompt; groups in `uniform` all score
  alike (advantage exactly 0), the others get non-zero advantages."""
  rng = np.random.default_rng(seed)
  rows = []
  for g in range(groups):
    prompt = list(rng.integers(3, CFG.vocab_size, 12 + g))
    adv = rng.normal(size=plays)
    for p in range(plays):
      n = int(rng.integers(4, 14))
      tokens = prompt + list(rng.integers(3, CFG.vocab_size, n))
      rows.append(Row(tokens, [False] * len(prompt) + [True] * n,
                      list(rng.uniform(-4, -1, len(tokens))),
                      0.0 if g in uniform else float(adv[p]), "agent", temperature=0.7))
  return rows


def _trainer(skip, loss=LossConfig(), batch_size=2):
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  return Trainer(CFG, TrainConfig(batch_size, T, logprob_chunk=0, share_prefix=8,
                                  skip_zero_advantage=skip),
                 loss, ADAM, mesh, parallel.RULE_SETS["fsdp"])


def _run(skip, steps, loss=LossConfig()):
  """Params and per-step metrics after `train` on each list of rows in `steps`."""
  tr = _trainer(skip, loss)
  state = tr.init_state(jax.random.key(0))
  out = []
  for rows in steps:
    state, m = train(tr, state, rows, pad_id=0)
    out.append(m)
  return jax.device_get(state.params), out


def _assert_same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", [
    LossConfig(),
    LossConfig(aggregation="seq_mean_token_mean"),
    LossConfig(aggregation="dr_grpo", dr_grpo_norm=16),
], ids=["token_mean", "seq_mean_token_mean", "dr_grpo"])
def test_leaving_out_zero_advantage_rows_gives_the_same_update(loss):
  steps = [_rows(0), _rows(1, uniform=(1,))]
  full, mf = _run(False, steps, loss)
  skip, ms = _run(True, steps, loss)
  _assert_same_params(full, skip)
  for a, b, rows in zip(mf, ms, steps):
    np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=1e-5)
    assert a["train/loss"] != 0
    zero = [r for r in rows if r.advantage == 0]
    assert b["batch/skipped_rows"] == len(zero) > 0 and a["batch/skipped_rows"] == 0
    assert b["batch/skipped_loss_tokens"] == sum(loss_tokens(r, T) for r in zero)
    # Fewer rows packed: the trained batch is narrower or holds fewer tokens.
    assert b["batch/loss_tokens"] + b["batch/skipped_loss_tokens"] == a["batch/loss_tokens"]


def test_an_update_with_no_row_left_applies_a_zero_gradient():
  # A real step first, so Adam's moments carry momentum into the all-uniform one.
  steps = [_rows(0), _rows(2, uniform=(0, 1, 2))]
  full, mf = _run(False, steps)
  skip, ms = _run(True, steps)
  _assert_same_params(full, skip)
  assert ms[1]["batch/skipped_rows"] == 12 and ms[1]["batch/batches"] == 0
  assert ms[1]["train/grad_norm"] == 0 == mf[1]["train/grad_norm"]
  assert "train/agent_logp_gap_mean" not in ms[1]  # nothing differentiated: no gap
  # The zero-gradient step still moved the weights (momentum, weight decay).
  once, _ = _run(True, steps[:1])
  moved = max(float(np.max(np.abs(a - b)))
              for a, b in zip(jax.tree.leaves(once), jax.tree.leaves(skip)))
  assert moved > 1e-5


@pytest.mark.parametrize("loss,objective", [
    (LossConfig(kl_coef=0.01), "grpo"),
    (LossConfig(entropy_coef=0.01), "grpo"),
    (LossConfig(aggregation="dr_grpo"), "grpo"),  # denominator depends on the width
    (LossConfig(), "sft"),
])
def test_rows_are_kept_where_leaving_them_out_would_change_the_update(loss, objective):
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  tr = Trainer(CFG, TrainConfig(2, T, logprob_chunk=0, objective=objective), loss, ADAM,
               mesh, parallel.RULE_SETS["fsdp"])
  assert not tr.skips_zero_advantage
  assert _trainer(True).skips_zero_advantage and not _trainer(False).skips_zero_advantage


def test_sequence_denominator_per_aggregation():
  assert sequence_denominator(LossConfig(), 7) == 7.0
  assert sequence_denominator(LossConfig(aggregation="seq_mean_token_mean"), 7) == 1.0
  assert sequence_denominator(LossConfig(aggregation="seq_mean_token_mean"), 0) == 0.0
  assert sequence_denominator(LossConfig(aggregation="dr_grpo", dr_grpo_norm=32), 7) == 32.0
  assert sequence_denominator(LossConfig(aggregation="dr_grpo"), 7) is None
