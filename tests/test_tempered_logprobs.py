"""The trained policy is the policy that samples: for fixed weights, the log-probs the
sampler records (multi-turn agent episodes and designer completions, at T 0.6 and 1.0,
with top-k / top-p on) equal the trainer's recompute of softmax(logits / T), and the
train step logs that gap per role."""

import dataclasses

import jax
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import ChatTemplate, get_preset, init_params
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer
from spade_jax.sampling import Sampler, SamplingConfig
from spade_jax.sandbox.pool import CallResult
from spade_jax.selfplay.batch import Row, build_batches
from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes

QWEN3 = get_preset("tiny")
B, T = 8, 256


class _Bytes:
  """Byte ids offset by 3 (0 pad, 1 EOS), the tiny preset's vocabulary."""

  eos_id, pad_id = 1, 0

  def encode(self, text):
    return [b + 3 for b in text.encode()]

  def decode(self, ids):
    return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


class _Pool:
  """Each episode runs 2 + seed % 2 turns; observations vary in length."""

  def start(self, sources, max_turns=25, class_names=None, action_mode="auto", kwargs=None):
    return [{"turn": 0, "seed": 0} for _ in sources]

  def reset_many(self, handles, seeds):
    for h, s in zip(handles, seeds):
      h["seed"], h["turn"] = s, 0
    return [CallResult(True, (f"start {s}", {})) for s in seeds]

  def step_many(self, handles, actions):
    out = []
    for h in handles:
      h["turn"] += 1
      end = h["turn"] >= 2 + h["seed"] % 2
      out.append(CallResult(True, ("obs" * (1 + h["turn"]), 1.0 if end else 0.0, end,
                                   False, {})))
    return out

  def release(self, handles):
    pass


def _rows(cfg, params, temperature):
  rule = SamplingConfig(temperature=temperature, top_k=20, top_p=0.95, eos_id=1, pad_id=0)
  chat = ChatTemplate(_Bytes())
  agent = Sampler(params, cfg, rule, jax.random.key(1))
  episodes = run_episodes(_Pool(), ["src"], [EpisodeSpec(0, s) for s in range(4)], agent,
                          chat, "play", max_turns=3, max_turn_tokens=12, max_len=T)
  assert max(ep.turns for ep in episodes) >= 2  # multi-turn rows
  rows = [Row(ep.tokens, ep.loss_mask, ep.logps, 1.0, "agent", rule.logprob_temperature)
          for ep in episodes]
  designer = Sampler(params, cfg, rule, jax.random.key(2))
  prompts = [chat.prompt("design", f"write program {i}") for i in range(3)]
  gen = designer(prompts, 20)
  for p, toks, lps in zip(prompts, gen.tokens, gen.logprobs):
    toks, lps = list(toks), list(lps)
    rows.append(Row(p + toks, [False] * len(p) + [True] * len(toks),
                    [0.0] * len(p) + lps, -1.0, "designer", rule.logprob_temperature))
  return rows


def _trainer(cfg):
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  return Trainer(cfg, TrainConfig(B, T, logprob_chunk=64), LossConfig(),
                 OptimizerConfig(learning_rate=1e-3), mesh, parallel.RULE_SETS["fsdp"])


def _recompute(tr, params, batch):
  return np.asarray(jax.jit(tr._logps)(params, tr._put(batch)))  # pylint: disable=protected-access


FAMILIES = {"qwen3": QWEN3}
if "qk_norm" in {f.name for f in dataclasses.fields(QWEN3)}:
  FAMILIES["llama"] = dataclasses.replace(QWEN3, qk_norm=False, rope_theta=10_000.0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_sampler_logprobs_equal_trainer_recompute(family, temperature):
  cfg = FAMILIES[family]
  params = init_params(jax.random.key(0), cfg)
  rows = _rows(cfg, params, temperature)
  batches, _ = build_batches(rows, B, T)
  assert len(batches) == 1
  batch = batches[0]
  mask = batch["loss_mask"]
  assert mask.sum() > 50 and set(np.unique(batch["role"][mask])) == {0, 1}
  np.testing.assert_array_equal(batch["temperature"][mask], np.float32(temperature))
  tr = _trainer(cfg)
  recomputed = _recompute(tr, params, batch)
  gap = np.abs(recomputed - batch["sampler_logps"])[mask]
  assert gap.max() < 1e-5, gap.max()
  if temperature != 1.0:
    # The untempered model is a different policy: the check above can fail.
    untempered = _recompute(tr, params, dict(batch, temperature=np.ones((B, T), np.float32)))
    assert np.abs(untempered - batch["sampler_logps"])[mask].max() > 1e-2
  state = tr.state_from_params(params)
  _, metrics = tr.step(state, batch)
  for role in ("agent", "designer"):
    assert float(metrics[f"{role}_logp_gap_max"]) < 1e-5
    assert 0.0 <= float(metrics[f"{role}_logp_gap_mean"]) <= float(
        metrics[f"{role}_logp_gap_max"])
  # TIS weights are exactly 1 when nothing is stale: the sampler is the trained policy.
  np.testing.assert_allclose(float(metrics["agent_tis_weight_mean"]), 1.0, atol=2e-5)


def test_gap_metrics_see_a_mismatch():
  cfg = QWEN3
  params = init_params(jax.random.key(0), cfg)
  rows = _rows(cfg, params, 0.6)
  batch = build_batches(rows, B, T)[0][0]
  batch["sampler_logps"] = np.where(batch["role"] == 1, batch["sampler_logps"] - 0.25,
                                    batch["sampler_logps"]).astype(np.float32)
  tr = _trainer(cfg)
  _, metrics = tr.step(tr.state_from_params(params), batch)
  np.testing.assert_allclose(float(metrics["agent_logp_gap_mean"]), 0.25, atol=1e-4)
  np.testing.assert_allclose(float(metrics["agent_logp_gap_max"]), 0.25, atol=1e-4)
  assert float(metrics["designer_logp_gap_max"]) < 1e-5


def test_row_rejects_a_bad_temperature():
  with pytest.raises(ValueError, match="temperature 0.0 must be > 0"):
    Row([1, 2], [False, True], [0.0, -1.0], 1.0, "agent", 0.0)
