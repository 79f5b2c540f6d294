"""Parity with `transformers` Qwen3 / Qwen3-MoE on tiny random checkpoints.

Each case builds a random model in PyTorch, saves it with `save_pretrained`,
imports it, and compares logits on a left-padded batch; exports go back
through `from_pretrained`. One case trains both from the same checkpoint (our SFT step vs
PyTorch AdamW) and compares every step's loss and the weights' movement.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from spade_jax import models  # pylint: disable=g-import-not-at-top
from spade_jax.models import forward, hf  # pylint: disable=g-import-not-at-top

V = 101
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              head_dim=16, intermediate_size=64, initializer_range=0.1,
              max_position_embeddings=128)
CASES = {
    "dense_gqa_tied": (tf.Qwen3Config, dict(num_key_value_heads=2, tie_word_embeddings=True,
                                            rope_theta=10000.0)),
    "dense_mqa_untied": (tf.Qwen3Config, dict(num_key_value_heads=1,
                                              tie_word_embeddings=False,
                                              rope_theta=1_000_000.0)),
    "moe_norm_topk": (tf.Qwen3MoeConfig, dict(
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=24, norm_topk_prob=True, tie_word_embeddings=False)),
    "moe_mlp_only": (tf.Qwen3MoeConfig, dict(
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=24, norm_topk_prob=False, mlp_only_layers=[1],
        tie_word_embeddings=True)),
    "moe_sparse_step": (tf.Qwen3MoeConfig, dict(
        num_hidden_layers=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=24, decoder_sparse_step=2, norm_topk_prob=True)),
}


def _build(directory, cls, kw):
  torch.manual_seed(0)
  cfg = cls(**{**COMMON, **kw})
  model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
  with torch.no_grad():  # non-trivial norm scales
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
  model.save_pretrained(directory)
  return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  return {name: (str(root / name), _build(str(root / name), cls, kw))
          for name, (cls, kw) in CASES.items()}


def _batch():
  rng = np.random.RandomState(0)
  B, T = 3, 12
  lengths = [12, 7, 3]
  toks = rng.randint(0, V, (B, T))
  valid = np.zeros((B, T), bool)
  for b, n in enumerate(lengths):
    valid[b, T - n:] = True  # left padding
  toks[~valid] = 0
  pos = np.maximum(np.cumsum(valid, 1) - 1, 0)
  return toks, valid, pos


def _hf_logits(model, toks, valid, pos):
  with torch.no_grad():
    return model(input_ids=torch.tensor(toks), attention_mask=torch.tensor(valid.astype(np.int64)),
                 position_ids=torch.tensor(pos)).logits.float().numpy()


def _ours(params, cfg, toks, valid, pos):
  T = toks.shape[1]
  mask = np.tril(np.ones((T, T), bool))[None] & valid[:, None, :]
  out, _ = jax.jit(forward, static_argnums=1)(params, cfg, jnp.asarray(toks),
                                              jnp.asarray(pos), jnp.asarray(mask))
  return np.asarray(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_logits_match_and_bf16_close(checkpoints, case):
  directory, model = checkpoints[case]
  toks, valid, pos = _batch()
  ref = _hf_logits(model, toks, valid, pos)
  params, cfg = hf.load_hf(directory)
  assert cfg.num_experts == CASES[case][1].get("num_experts", 0)
  got = _ours(params, cfg, toks, valid, pos)
  err = np.abs(got - ref)[valid].max()
  assert err < 1e-4, f"{case}: max abs logit error {err}"

  p16, c16 = hf.load_hf(directory, param_dtype="bfloat16", compute_dtype="bfloat16")
  low = _ours(p16, c16, toks, valid, pos)
  lp_ref = jax.nn.log_softmax(ref, -1)
  lp_low = jax.nn.log_softmax(low, -1)
  kl = np.sum(np.exp(lp_ref) * (lp_ref - lp_low), -1)[valid].mean()
  assert kl < 1e-3, f"{case}: bf16 mean KL {kl}"


@pytest.mark.parametrize("case", ["dense_mqa_untied", "moe_mlp_only"])
def test_export_round_trip_is_bit_exact(checkpoints, case, tmp_path):
  directory, model = checkpoints[case]
  params, cfg = hf.load_hf(directory)
  hf.save_hf(str(tmp_path), params, cfg, base_config=hf.read_hf_config(directory))
  back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                 attn_implementation="eager").eval()
  toks, valid, pos = _batch()
  np.testing.assert_array_equal(_hf_logits(back, toks, valid, pos),
                                _hf_logits(model, toks, valid, pos))
  # And our own re-import sees identical parameters.
  again, cfg2 = hf.load_hf(str(tmp_path))
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, again, params)


def test_sharded_export_and_streamed_sharded_import(checkpoints, tmp_path):
  from spade_jax import parallel  # pylint: disable=g-import-not-at-top
  directory, _ = checkpoints["moe_norm_topk"]
  params, cfg = hf.load_hf(directory)
  hf.save_hf(str(tmp_path), params, cfg, max_shard_bytes=20_000)
  index = json.load(open(tmp_path / "model.safetensors.index.json"))
  assert len(set(index["weight_map"].values())) > 2
  mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=2, tensor=2, expert=2,
                                                rules="fsdp_tensor_expert"))
  shard = parallel.tree_shardings(models.param_axes(cfg), models.param_shapes(cfg), mesh,
                                  parallel.RULE_SETS["fsdp_tensor_expert"])
  sharded, _ = hf.load_hf(str(tmp_path), shardings=shard)
  assert sharded["moe"]["gate"].sharding.spec[1] == "expert"
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               sharded, params)


def test_import_errors_name_the_problem(checkpoints, tmp_path):
  directory, _ = checkpoints["dense_gqa_tied"]
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.load_hf(str(tmp_path))
  base = hf.read_hf_config(directory)
  with pytest.raises(ValueError, match="model_type='mistral'"):
    hf.config_from_hf({**base, "model_type": "mistral"})
  with pytest.raises(ValueError, match="unsupported config key.*'quantization_config'"):
    hf.config_from_hf({**base, "quantization_config": {"bits": 4}})
  with pytest.raises(ValueError, match="attention_bias"):
    hf.config_from_hf({**base, "attention_bias": True})
  # Wrong tensor shape: claim a wider MLP than the weights hold.
  os.symlink(os.path.join(directory, "model.safetensors"), tmp_path / "model.safetensors")
  json.dump({**base, "intermediate_size": 80}, open(tmp_path / "config.json", "w"))
  with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.\w+_proj\.weight.*has shape.*64.*implies.*80"):
    hf.load_hf(str(tmp_path))
  os.remove(tmp_path / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load_hf(str(tmp_path))


def test_sft_train_steps_track_transformers_with_torch_adamw(tmp_path):
  """Six SFT steps from one checkpoint on the same rows: our trainer vs PyTorch.

  Rows of two packed 160-token segments (320 queries: the blocked attention kernel and
  the chunked log-probs) against each segment as its own PyTorch row; AdamW with decay
  off the norm scales, global-norm clipping that bites, warm-up + cosine schedule.
  """
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from spade_jax import parallel  # pylint: disable=g-import-not-at-top
  from spade_jax.models import attention  # pylint: disable=g-import-not-at-top
  from spade_jax.rl import (LossConfig, OptimizerConfig, TrainConfig,  # pylint: disable=g-import-not-at-top
                            Trainer)
  from spade_jax.rl import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  B, S, P, steps = 8, 160, 2, 6
  assert S * P > attention.ATTENTION_BLOCK
  torch.manual_seed(1)
  cfg_t = tf.Qwen3Config(**{**COMMON, "max_position_embeddings": 512},
                         num_key_value_heads=1, tie_word_embeddings=True)
  model = tf.AutoModelForCausalLM.from_config(cfg_t, attn_implementation="eager")
  model.save_pretrained(tmp_path / "start")
  params, cfg = models.load_hf(str(tmp_path / "start"))
  ocfg = OptimizerConfig(learning_rate=3e-3, schedule="cosine", warmup_steps=2,
                         total_steps=steps, weight_decay=0.1, b1=0.9, b2=0.98, grad_clip=0.5)
  mesh_cfg = parallel.MeshConfig()
  trainer = Trainer(cfg, TrainConfig(B, S * P, 1, objective="sft"),
                    LossConfig(kl_coef=0.0, aggregation="token_mean"), ocfg,
                    parallel.make_mesh(mesh_cfg, jax.devices()),
                    parallel.RULE_SETS[mesh_cfg.rules])
  state = trainer.state_from_params(params)
  named = list(model.named_parameters())
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in named if "norm" not in n], "weight_decay": 0.1},
       {"params": [p for n, p in named if "norm" in n], "weight_decay": 0.0}],
      lr=3e-3, betas=(0.9, 0.98), eps=1e-8)
  schedule = opt_lib.SCHEDULES["cosine"](ocfg)
  start = {n: p.detach().clone() for n, p in named}
  rng = np.random.default_rng(0)
  model.train()
  for step in range(steps):
    tokens = rng.integers(3, V, (B * P, S)).astype(np.int32)
    mask = np.arange(S)[None] >= rng.integers(1, S // 2, (B * P, 1))  # a prompt, then targets
    batch = dict(tokens=tokens.reshape(B, S * P), positions=np.tile(np.arange(S), (B, P)),
                 segment_ids=np.repeat(np.arange(1, P + 1), S)[None].repeat(B, 0),
                 loss_mask=mask.reshape(B, S * P), role=np.zeros((B, S * P), np.int32))
    state, metrics = trainer.step(state, batch)
    for group in opt.param_groups:
      group["lr"] = float(schedule(step))
    x = torch.from_numpy(tokens).long()
    logp = torch.log_softmax(model(input_ids=x).logits.float()[:, :-1], -1)
    logp = logp.gather(-1, x[:, 1:, None])[..., 0]
    m = torch.from_numpy(mask[:, 1:]).float()
    loss = -(logp * m).sum() / m.sum()
    opt.zero_grad()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
    opt.step()
    assert norm > 0.5 or step > 0  # clipping acts on the first step at least
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=2e-5)
  models.save_hf(str(tmp_path / "ours"), jax.device_get(state.params), cfg)
  ours = load_file(str(tmp_path / "ours" / "model.safetensors"))
  for name, p in named:
    moved, ours_moved = (p.detach() - start[name]).numpy(), ours[name] - start[name].numpy()
    assert np.linalg.norm(moved) > 1e-3, name
    assert np.linalg.norm(ours_moved - moved) <= 2e-3 * np.linalg.norm(moved), name
