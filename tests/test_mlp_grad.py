"""The gated MLP's hand-written VJP (`ModelConfig.mlp_grad="manual"`) against autodiff."""

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import ModelConfig, get_preset, qwen3
from spade_jax.registry import UnknownNameError
from spade_jax.rl import LossConfig, OptimizerConfig, TrainConfig, Trainer

B, T = 8, 32


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def test_gated_mlp_vjp_equals_autodiff_sharded():
  """Input and weight gradients of the MLP alone, sharded over the 8 test devices."""
  D, F = 24, 40
  k = jax.random.split(jax.random.key(0), 5)
  h = jax.random.normal(k[0], (B, T, D))
  ws = [0.3 * jax.random.normal(k[i], s) for i, s in ((1, (D, F)), (2, (D, F)), (3, (F, D)))]
  dout = jax.random.normal(k[4], (B, T, D))
  mesh = parallel.make_mesh(parallel.MeshConfig(data=2, fsdp=2, tensor=2,
                                                rules="fsdp_tensor"))
  rules = parallel.RULE_SETS["fsdp_tensor"]

  def vjp(f):
    def run(h, wg, wu, wd):
      with parallel.activation_sharding(mesh, rules):
        out, pull = jax.vjp(f, h, wg, wu, wd)
        return out, pull(dout)
    return jax.jit(run)

  h = jax.device_put(h, parallel.batch_sharding(mesh, rules, 3))
  specs = (P("fsdp", "tensor"), P("fsdp", "tensor"), P("tensor", "fsdp"))
  ws = [jax.device_put(w, NamedSharding(mesh, s)) for w, s in zip(ws, specs)]
  ref_out, ref = vjp(qwen3._gated_mlp_forward)(h, *ws)  # pylint: disable=protected-access
  out, got = vjp(qwen3.gated_mlp)(h, *ws)
  np.testing.assert_array_equal(out, ref_out)  # the same forward
  for name, a, b in zip(("h", "gate", "up", "down"), got, ref):
    assert a.shape == b.shape and a.dtype == b.dtype, name
    assert _rel(a, b) < 1e-5, (name, _rel(a, b))
    assert np.max(np.abs(np.asarray(b))) > 0, name


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_train_step_gradients_equal_autodiff(remat):
  """Every parameter's gradient through the whole GRPO loss: tiny model, scanned
  layers, rematerialised, parameters and batch sharded over the 8 test devices."""
  base = dataclasses.replace(get_preset("tiny"), num_layers=3, scan_layers=True,
                             remat=remat)
  mesh = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=-1, rules="fsdp"))
  rng = np.random.default_rng(0)
  batch = dict(tokens=rng.integers(3, 259, (B, T)), positions=np.tile(np.arange(T), (B, 1)),
               segment_ids=np.ones((B, T), np.int32), loss_mask=rng.random((B, T)) < 0.7,
               sampler_logps=rng.uniform(-6.0, -5.0, (B, T)).astype(np.float32),
               advantages=rng.normal(size=B).astype(np.float32),
               role=np.ones(B, np.int32), temperature=np.full(B, 0.7, np.float32))
  out = {}
  for mode in ("autodiff", "manual"):
    cfg = dataclasses.replace(base, mlp_grad=mode)
    tr = Trainer(cfg, TrainConfig(B, T, logprob_chunk=16), LossConfig(),
                 OptimizerConfig(), mesh, parallel.RULE_SETS["fsdp"])
    params = tr.init_state(jax.random.key(0)).params
    mb = tr._put(batch)  # pylint: disable=protected-access

    def grad(p, tr=tr, mb=mb):
      with parallel.activation_sharding(mesh, tr.rules):
        return jax.value_and_grad(tr._micro_terms, has_aux=True)(p, None, mb)  # pylint: disable=protected-access

    (loss, _), g = jax.jit(grad)(params)
    out[mode] = jax.device_get((loss, g))
  (l_a, g_a), (l_m, g_m) = out["autodiff"], out["manual"]
  np.testing.assert_array_equal(l_m, l_a)  # the forward is the same program
  flat_a = jax.tree_util.tree_flatten_with_path(g_a)[0]
  for (path, a), m in zip(flat_a, jax.tree.leaves(g_m)):
    name = jax.tree_util.keystr(path)
    assert np.max(np.abs(a)) > 0, name
    assert _rel(m, a) < 1e-5, (name, _rel(m, a))


def test_forward_unchanged_and_bad_name():
  cfg = dataclasses.replace(get_preset("tiny"), mlp_grad="manual")
  params = qwen3.init_params(jax.random.key(1), cfg)
  tokens = jnp.arange(24).reshape(2, 12) + 3
  pos = jnp.tile(jnp.arange(12), (2, 1))
  seg = jnp.ones((2, 12), jnp.int32)
  got = qwen3.token_logprobs(params, cfg, tokens, pos, seg)
  want = qwen3.token_logprobs(params, dataclasses.replace(cfg, mlp_grad="autodiff"),
                              tokens, pos, seg)
  np.testing.assert_array_equal(got, want)
  with pytest.raises(UnknownNameError, match="model.mlp_grad"):
    ModelConfig(mlp_grad="manul")


def test_mlp_grad_is_a_runtime_setting_over_a_checkpoint():
  """A run that starts from a checkpoint may choose the MLP's gradient (switch back)."""
  from experiments.configs import games  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay import build  # pylint: disable=g-import-not-at-top
  c = games.get_config("smoke")
  assert build.resolve(c).model.mlp_grad == "manual"
  c.model.mlp_grad = "autodiff"
  assert build.resolve(c).model.mlp_grad == "autodiff"
