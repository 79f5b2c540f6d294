"""Engine: rows that start with the same prompt in one extend compute it once (shared
prompts) and sample exactly as rows that computed their own."""

import jax
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset, init_params
from spade_jax.sampling import Engine, SamplingConfig

CFG = get_preset("tiny")
SLOTS = 8
A, B, C = [5, 6, 7, 8, 9, 10, 11], [12, 13] * 6, [40 + i % 9 for i in range(40)]
# Turn 1: rows 0, 2, 5 play A; 1 and 4 play B; 6 and 7 play C; row 3 a prefix of A.
FIRST = {0: A, 1: B, 2: A, 3: A[:5], 4: B, 5: A, 6: C, 7: C}
# Turn 2: rows 0 and 2 take the same observation (continuations: never shared), row 1
# takes A as an observation, rows 3 and 6 start again with A (shared with each other,
# not with row 1), row 5 (released, history empty) starts B without a key.
SECOND = {0: [70, 71], 2: [70, 71], 1: A, 3: A, 6: A, 5: B}
SECOND_STARTS = (3, 6)


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _cache_rows(eng):
  """Each row's cache entries [0, length), per layer (keys length-last, values [S, E])."""
  out = []
  per_layer = isinstance(eng.state.cache["k"], tuple)
  ks = [np.asarray(x) for x in eng.state.cache["k"]] if per_layer else list(
      np.asarray(eng.state.cache["k"]))
  vs = [np.asarray(x) for x in eng.state.cache["v"]] if per_layer else list(
      np.asarray(eng.state.cache["v"]))
  for b in range(eng.slots):
    n = int(eng.lengths[b])
    out.append([(k[b][..., :n], v[b][..., :n, :]) for k, v in zip(ks, vs)])
  return out


def _play(params, share: bool, layer_cache: str, decode_layout: str):
  rule = SamplingConfig(temperature=1.0, eos_id=-1, eos_ids=(7,))
  base = jax.random.key(3)
  eng = Engine(CFG, params, slots=SLOTS, max_len=128, rule=rule, cache_dtype="float32",
               layer_cache=layer_cache, decode_layout=decode_layout, share_prompts=share)
  eng.extend(FIRST, {b: jax.random.fold_in(base, b) for b in FIRST})
  after_first = dict(lengths=eng.lengths.copy(), logits=np.asarray(eng.state.logits),
                     keys=np.asarray(jax.random.key_data(eng.state.keys)),
                     cache=_cache_rows(eng), positions=list(eng.extend_positions),
                     shared=list(eng.shared_prompts))
  first = eng.decode({b: 6 + b for b in range(SLOTS)})
  eng.release([5])
  eng.extend(SECOND, {b: jax.random.fold_in(base, 10 + b) for b in SECOND_STARTS})
  shared = list(eng.shared_prompts)
  second = eng.decode({b: 10 for b in SECOND})
  third_rows = [b for b in range(SLOTS) if b not in SECOND]
  eng.extend({b: [90, 91] for b in third_rows})  # continuations with equal chunks
  third = eng.decode({b: 5 for b in third_rows})
  return dict(first=after_first, shared=shared, outs=(first, second, third),
              lengths=eng.lengths.copy(), positions=list(eng.extend_positions),
              programs={p for p in eng.programs if p[0] == "share"})


@pytest.mark.parametrize("layer_cache,decode_layout",
                         [("per_layer", "feature_major"), ("stacked", "batch_major"),
                          ("per_layer", "batch_major"), ("stacked", "feature_major")])
def test_shared_prompts_sample_as_rows_that_computed_them(params, layer_cache, decode_layout):
  on = _play(params, True, layer_cache, decode_layout)
  off = _play(params, False, layer_cache, decode_layout)
  # Turn 1: rows 2 and 5 copy row 0, row 4 copies row 1, row 7 copies row 6; turn 2: row 6
  # copies row 3. Nothing else (the continuations and row 1's observation compute).
  assert on["first"]["shared"] == [4, 2 * len(A) + len(B) + len(C)]
  assert on["shared"] == [5, 3 * len(A) + len(B) + len(C)]
  assert off["shared"] == [0, 0]
  # Fewer rows computed: fewer real tokens and padded positions.
  f_on, f_off = on["first"], off["first"]
  assert f_off["positions"][0] == sum(len(t) for t in FIRST.values())
  assert f_on["positions"][0] == f_off["positions"][0] - on["first"]["shared"][1]
  assert f_on["positions"][1] < f_off["positions"][1]
  assert on["positions"][1] < off["positions"][1]
  assert on["programs"] and all(n & (n - 1) == 0 for _, n, _ in on["programs"])
  assert not off["programs"]
  # After the first extend: the copied rows' state equals the state they computed.
  np.testing.assert_array_equal(f_on["lengths"], f_off["lengths"])
  np.testing.assert_array_equal(f_on["keys"], f_off["keys"])
  np.testing.assert_allclose(f_on["logits"], f_off["logits"], atol=1e-4)
  for b in range(SLOTS):
    for (k1, v1), (k2, v2) in zip(f_on["cache"][b], f_off["cache"][b]):
      np.testing.assert_allclose(k1, k2, atol=1e-5)
      np.testing.assert_allclose(v1, v2, atol=1e-5)
  # Same tokens and log-probs per row in every turn; rows sharing a prompt keep their own
  # keys (they do not all sample the same continuation).
  for a, b in zip(on["outs"], off["outs"]):
    assert a.keys() == b.keys()
    for r in a:
      assert a[r][0] == b[r][0] and a[r][2] == b[r][2], (r, a[r], b[r])
      np.testing.assert_allclose(a[r][1], b[r][1], atol=1e-5)
  first = on["outs"][0]
  assert len({tuple(first[r][0]) for r in (0, 2, 5)}) > 1
  np.testing.assert_array_equal(on["lengths"], off["lengths"])


def test_share_programs_are_bucketed_and_padding_writes_nothing(params):
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  eng = Engine(CFG, params, slots=SLOTS, max_len=64, rule=rule, cache_dtype="float32")
  keys = {b: jax.random.key(b) for b in range(SLOTS)}
  eng.extend({0: [3, 4, 5], 1: [9] * 20})
  before = _cache_rows(eng)
  # Three copies of row 2's prompt (a bucket of 4: one padded entry) leave rows 0, 1 alone.
  eng.extend({b: [6, 7, 8, 9] for b in range(2, 6)}, {b: keys[b] for b in range(2, 6)})
  assert eng.shared_prompts == [3, 12]
  assert {p for p in eng.programs if p[0] == "share"} == {("share", 4, 16)}
  after = _cache_rows(eng)
  for b in (0, 1):
    for (k1, v1), (k2, v2) in zip(before[b], after[b]):
      np.testing.assert_array_equal(k1, k2)
      np.testing.assert_array_equal(v1, v2)
  np.testing.assert_array_equal(eng.lengths, [3, 20, 4, 4, 4, 4, 0, 0])
  assert eng.fresh[:6].all() and not eng.fresh[6:].any()


@pytest.mark.slow
def test_share_program_keeps_the_sharded_layout(params):
  # On a mesh every extend runs every row, so prompts are not shared; the copy program
  # still keeps the state's shardings.
  mesh = parallel.make_mesh(parallel.MeshConfig(data=4, fsdp=1, tensor=2, rules="fsdp_tensor"))
  rules = parallel.RULE_SETS["fsdp_tensor"]
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  for layer_cache in ("per_layer", "stacked"):
    eng = Engine(CFG, params, slots=SLOTS, max_len=64, rule=rule, cache_dtype="float32",
                 mesh=mesh, rules=rules, layer_cache=layer_cache)
    eng.extend({0: A, 1: A}, {0: jax.random.key(0), 1: jax.random.key(1)})
    assert eng.shared_prompts == [0, 0]
    shardings = jax.tree.map(lambda x: x.sharding, eng.state)
    eng.state = eng._share(eng.state, np.array([0, SLOTS], np.int32),
                           np.array([2, SLOTS], np.int32), np.array([True, False]),
                           jax.random.split(jax.random.key(5), 2), span=16)
    assert jax.tree.map(lambda x: x.sharding, eng.state) == shardings
    assert int(eng.state.lengths[2]) == len(A)
    np.testing.assert_array_equal(np.asarray(eng.state.logits[2]),
                                  np.asarray(eng.state.logits[0]))


def test_a_fresh_engine_compiles_its_extend_once(params):
  """The empty state sits on the parameters' device like every program's output, so the
  second round of the same shapes compiles nothing."""
  committed = jax.device_put(params, jax.devices()[0])
  eng = Engine(CFG, committed, slots=16, max_len=80,
               rule=SamplingConfig(temperature=0.7, top_p=1.0, top_k=0))
  keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(1), 16)))
  sizes = []
  for _ in range(3):
    eng.extend({i: [5, 6, 7, 8 + i // 8] for i in range(16)}, dict(enumerate(keys)))
    eng.decode({i: 3 for i in range(16)})
    eng.release(list(range(16)))
    sizes.append(eng._extend._cache_size())  # pylint: disable=protected-access
  assert sizes[2] == sizes[1] == sizes[0], sizes
