"""Supervised (next-token) objective on the GRPO trainer: goldens, accumulation, packing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import forward, get_preset
from spade_jax.registry import UnknownNameError
from spade_jax.rl import (ROLES, LossConfig, OptimizerConfig, TrainConfig, Trainer,
                          sft_loss, sft_loss_terms, trained_tokens)
from spade_jax.selfplay.batch import Row, build_batches

CFG = get_preset("tiny")
B, T = 8, 32
SGD = OptimizerConfig(name="sgd", learning_rate=1.0, grad_clip=0.0)  # params move by -grad


def _sequences(seed=0, n=10):
  """(tokens, loss_mask, role) triples: a prompt (not trained) then a target."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    p, q = int(rng.integers(2, 8)), int(rng.integers(3, 12))
    tokens = rng.integers(3, CFG.vocab_size, p + q).astype(np.int32)
    mask = np.r_[np.zeros(p, bool), np.ones(q, bool)]
    if i == 3:
      mask[:] = True  # a first token marked as a target: never trained on
    if i == 5:
      mask[:] = False  # nothing to train: no sequence for the sequence mean
    out.append((tokens, mask, i % 2))
  return out


def _pack(seqs):
  """First-fit packing written out by hand: segment ids 1, 2, ... per row."""
  batch = dict(tokens=np.zeros((B, T), np.int32), positions=np.zeros((B, T), np.int32),
               segment_ids=np.zeros((B, T), np.int32), loss_mask=np.zeros((B, T), bool),
               role=np.zeros((B, T), np.int32))
  fill, segs = [0] * B, [0] * B
  for tokens, mask, role in seqs:
    r = next(i for i in range(B) if fill[i] + len(tokens) <= T)
    s, e = fill[r], fill[r] + len(tokens)
    segs[r] += 1
    batch["tokens"][r, s:e], batch["loss_mask"][r, s:e] = tokens, mask
    batch["positions"][r, s:e], batch["segment_ids"][r, s:e] = np.arange(e - s), segs[r]
    batch["role"][r, s:e] = role
    fill[r] = e
  assert sum(1 for f in fill if f) > 1 and max(segs) > 1  # really packed
  return batch


def _golden_logits(params, seqs):
  """Logits [n, T, V] of each sequence alone in its row (causal, right padding)."""
  n = len(seqs)
  tokens = np.zeros((n, T), np.int32)
  lengths = np.array([len(s[0]) for s in seqs])
  for i, (tok, _, _) in enumerate(seqs):
    tokens[i, :len(tok)] = tok
  keys = np.arange(T)
  mask = (keys[None, :, None] >= keys[None, None, :]) & (keys[None, None, :] < lengths[:, None, None])
  logits, _ = forward(params, CFG, jnp.asarray(tokens),
                      jnp.asarray(np.tile(np.arange(T), (n, 1))), jnp.asarray(mask))
  return logits


def _golden(params, seqs):
  """Per sequence: NLLs of its trained tokens (float64 log-softmax of `forward`)."""
  logits = np.asarray(_golden_logits(params, seqs), np.float64)
  out = []
  for i, (tok, mask, _) in enumerate(seqs):
    z = logits[i, :len(tok) - 1]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(tok) - 1), tok[1:]]  # position t - 1 predicts token t
    out.append(nll[mask[1:]])  # the first token is never a target
  return out


def _trainer(devices=1, micro=1, aggregation="token_mean", opt=SGD, mesh_cfg=None):
  mesh_cfg = mesh_cfg or parallel.MeshConfig()
  mesh = parallel.make_mesh(mesh_cfg, jax.devices()[:devices])
  return Trainer(CFG, TrainConfig(B, T, micro, logprob_chunk=8, objective="sft"),
                 LossConfig(aggregation=aggregation), opt, mesh,
                 parallel.RULE_SETS[mesh_cfg.rules])


def _step(tr, batch, key=0):
  """(params before, params after, metrics) of one update from a fresh state."""
  state = tr.init_state(jax.random.key(key))
  before = jax.device_get(state.params)
  state, m = tr.step(state, batch)
  return before, jax.device_get(state.params), jax.device_get(m)


@pytest.fixture(scope="module")
def packed_step():
  seqs = _sequences()
  return seqs, _step(_trainer(), _pack(seqs))


def test_golden_loss_and_metrics_equal_numpy(packed_step):
  seqs, (params, _, m) = packed_step
  nlls = _golden(params, seqs)
  flat = np.concatenate(nlls)
  np.testing.assert_allclose(m["loss"], flat.mean(), rtol=1e-5)
  np.testing.assert_allclose(m["nll"], flat.mean(), rtol=1e-5)
  np.testing.assert_allclose(m["perplexity"], np.exp(flat.mean()), rtol=1e-5)
  assert m["token_count"] == len(flat) == sum(mask[1:].sum() for _, mask, _ in seqs)
  assert m["sequence_count"] == sum(1 for x in nlls if len(x)) == len(seqs) - 1
  for r, name in enumerate(ROLES):
    mine = np.concatenate([x for x, s in zip(nlls, seqs) if s[2] == r])
    assert m[f"{name}_tokens"] == len(mine)
    np.testing.assert_allclose(m[f"{name}_nll"], mine.mean(), rtol=1e-5)
  assert np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0


def test_golden_update_is_the_gradient_of_the_mean_nll(packed_step):
  """SGD(lr=1): params move by minus the gradient of an independent jnp loss."""
  seqs, (before, after, _) = packed_step
  targets = np.zeros((len(seqs), T), np.int32)
  weight = np.zeros((len(seqs), T), np.float32)  # weight[i, t]: position t predicts t + 1
  for i, (tok, mask, _) in enumerate(seqs):
    targets[i, :len(tok) - 1], weight[i, :len(tok) - 1] = tok[1:], mask[1:]

  def loss(p):
    logp = jax.nn.log_softmax(_golden_logits(p, seqs), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], -1)[..., 0]
    return -jnp.sum(picked * weight) / weight.sum()

  grad = jax.jit(jax.grad(loss))(before)
  for a, b, g in zip(jax.tree.leaves(after), jax.tree.leaves(before), jax.tree.leaves(grad)):
    np.testing.assert_allclose(b - a, g, atol=2e-6, rtol=1e-4)


def test_golden_sequence_mean_aggregation():
  seqs = _sequences()
  params, _, m = _step(_trainer(aggregation="seq_mean_token_mean"), _pack(seqs))
  nlls = [x for x in _golden(params, seqs) if len(x)]
  np.testing.assert_allclose(m["loss"], np.mean([x.mean() for x in nlls]), rtol=1e-5)
  np.testing.assert_allclose(m["nll"], np.concatenate(nlls).mean(), rtol=1e-5)


def test_four_microbatches_equal_full_batch(packed_step):
  seqs, (_, one, m1) = packed_step
  _, four, m4 = _step(_trainer(micro=4), _pack(seqs))
  for k in ("loss", "grad_norm", "token_count", "sequence_count", "agent_nll"):
    np.testing.assert_allclose(m4[k], m1[k], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(four), jax.tree.leaves(one)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _rows(seqs):
  return [Row(list(t), list(m), [0.0] * len(t), 0.0, ROLES[r]) for t, m, r in seqs]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_packed_equals_one_sequence_per_row(aggregation):
  """build_batches: 1 packed batch vs 2 unpacked ones (10 rows) give one update."""
  seqs = _sequences(seed=1)
  packed, _ = build_batches(_rows(seqs), B, T, pack=True)
  unpacked, _ = build_batches(_rows(seqs), B, T, pack=False)
  assert (len(packed), len(unpacked)) == (1, 2)
  tr = _trainer(aggregation=aggregation)
  _, p_packed, m_packed = _step(tr, packed)
  _, p_rows, m_rows = _step(tr, unpacked)
  for k in ("loss", "nll", "grad_norm", "token_count", "sequence_count"):
    np.testing.assert_allclose(m_rows[k], m_packed[k], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p_rows), jax.tree.leaves(p_packed)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_eight_devices_match_one():
  opt = OptimizerConfig(learning_rate=1e-3)
  mesh_cfg = parallel.MeshConfig(data=2, fsdp=2, tensor=2, rules="fsdp_tensor")
  results = []
  for tr in (_trainer(opt=opt), _trainer(8, opt=opt, mesh_cfg=mesh_cfg)):
    state = tr.init_state(jax.random.key(0))
    for seed in (0, 1):  # two updates: the second from moved weights and Adam moments
      state, m = tr.step(state, _pack(_sequences(seed)))
    results.append((jax.device_get(state.params), jax.device_get(m)))
  (p1, m1), (p8, m8) = results
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-4)
  for a, b in zip(jax.tree.leaves(p8), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_repeated_pattern_is_learned():
  """A prompt then a repeated 4-token pattern: a few SFT steps cut the loss > 50%."""
  pattern = [17, 42, 99, 7]
  seqs = [(np.array([3 + i, 200] + pattern * 4, np.int32),
           np.r_[np.zeros(2, bool), np.ones(16, bool)], i % 2) for i in range(8)]
  rows = _rows(seqs)
  batches, _ = build_batches(rows, B, T)
  tr = _trainer(opt=OptimizerConfig(name="adam", learning_rate=1e-2))
  state = tr.init_state(jax.random.key(0))
  losses = []
  for _ in range(12):
    state, m = tr.step(state, batches)
    losses.append(float(m["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses
  assert losses[0] > 4.0  # near log(259) before training


def test_sft_terms_ignore_untrained_tokens_exactly():
  """Segment starts, padding and masked tokens: no loss, no count, zero gradient."""
  logps = jnp.array([[0.0, -1.0, -2.0, 0.0, -4.0, jnp.nan],
                     [0.0, -3.0, -5.0, -7.0, 0.0, 0.0]])
  mask = jnp.array([[1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1]], bool)
  seg = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0]])
  assert np.array_equal(trained_tokens(mask, seg),
                        [[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0]])
  assert np.array_equal(trained_tokens(mask), [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])
  (loss, m), g = jax.value_and_grad(
      lambda x: sft_loss(x, mask, segment_ids=seg), has_aux=True)(logps)
  np.testing.assert_allclose(loss, (1 + 2 + 4 + 5 + 7) / 5)
  np.testing.assert_allclose(g, np.where(trained_tokens(mask, seg), -1 / 5, 0.0))
  assert m["token_count"] == 5 and m["sequence_count"] == 3
  s, d, _ = sft_loss_terms(logps, mask, segment_ids=seg,
                           config=LossConfig(aggregation="seq_mean_token_mean"))
  np.testing.assert_allclose(s / d, (1.5 + 4 + 6) / 3)


def test_objective_names_and_refused_settings():
  with pytest.raises(UnknownNameError, match=r"Set train.objective"):
    TrainConfig(B, T, objective="dpo")
  mesh = parallel.make_mesh(parallel.MeshConfig(), jax.devices()[:1])
  with pytest.raises(ValueError, match=r"loss.kl_coef=0.1"):
    Trainer(CFG, TrainConfig(B, T, objective="sft"), LossConfig(kl_coef=0.1),
            OptimizerConfig(), mesh, parallel.RULE_SETS["fsdp"])
  # GRPO still needs every field; SFT only tokens, positions, segment ids and the mask.
  tr = Trainer(CFG, TrainConfig(B, T), LossConfig(), OptimizerConfig(), mesh,
               parallel.RULE_SETS["fsdp"])
  batch = {k: v for k, v in _pack(_sequences()).items() if k != "role"}
  with pytest.raises(ValueError, match="missing field 'sampler_logps'"):
    tr.step(tr.init_state(jax.random.key(0)), batch)
