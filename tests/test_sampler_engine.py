"""Engine: multi-turn continuation vs re-prefill, slot refill vs alone, stop strings,
per-row cache ends, min-p, sharded layout and weight handoff."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import parallel
from spade_jax.models import get_preset, init_params, token_logprobs
from spade_jax.sampling import (Engine, MinP, Request, SamplingConfig, TopK, draw,
                                row_keys, serve)
from spade_jax.sampling import engine as engine_lib

CFG = get_preset("tiny")
SLOTS, MAX_LEN = 4, 128


@pytest.fixture(scope="module")
def params():
  return init_params(jax.random.key(0), CFG)


def _engine(params, rule, **kw):
  return Engine(CFG, params, slots=kw.pop("slots", SLOTS), max_len=kw.pop("max_len", MAX_LEN),
                rule=rule, cache_dtype="float32", **kw)


def _full_logps(params, seq, width=64):
  """Log-probs from one full forward; padded to `width` so every call shares one program."""
  n = len(seq)
  t = jnp.array([list(seq) + [0] * (width - n)])
  seg = jnp.array([[1] * n + [0] * (width - n)])
  return np.asarray(token_logprobs(params, CFG, t, jnp.arange(width)[None], seg))[0, :n]


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40] * 13]
OBS = {1: [[70, 71, 72], [73], [74, 75, 76, 77, 78]],   # turn -> per-row observation
       2: [[80], [81, 82, 83, 84, 85, 86], None]}        # row 2 ends after turn 2
TURN = [8, 5, 7]  # new tokens per turn for each row


def _conversation(params, rule, continue_cache: bool, layer_cache: str = "auto",
                  decode_layout: str = "auto"):
  """Three turns; returns per-row histories and per-row (tokens, logps) per turn."""
  keys = row_keys(jax.random.key(11), len(PROMPTS))
  hist = [list(p) for p in PROMPTS]
  turns = []
  eng = _engine(params, rule, layer_cache=layer_cache, decode_layout=decode_layout)
  live = [0, 1, 2]
  for t in range(3):
    if t == 0 or not continue_cache:
      if not continue_cache and t > 0:
        eng = _engine(params, rule)  # fresh cache: the whole history again
      eng.extend({i: hist[i] for i in live}, {i: keys[i] for i in live})
    else:
      eng.extend({i: OBS[t][i] for i in live})
      for i in live:
        hist[i] += OBS[t][i]
    out = eng.decode({i: TURN[i] for i in live})
    turns.append({i: out[i] for i in live})
    for i in live:
      hist[i] += out[i][0]
    if t + 1 < 3:
      if not continue_cache:
        for i in live:
          hist[i] += OBS[t + 1][i] or []
      live = [i for i in live if OBS[t + 1][i] is not None]
      eng.release([i for i in range(SLOTS) if i not in live])
  return hist, turns


@pytest.mark.parametrize("temperature,layer_cache,decode_layout",
                         [(0.0, "per_layer", "feature_major"), (1.0, "per_layer", "batch_major"),
                          (1.0, "stacked", "feature_major"), (0.0, "stacked", "batch_major")])
def test_three_turns_through_cache_equal_reprefill(params, temperature, layer_cache,
                                                   decode_layout):
  rule = SamplingConfig(temperature=temperature, top_k=50, eos_id=-1)
  h_cache, t_cache = _conversation(params, rule, True, layer_cache, decode_layout)
  h_full, t_full = _conversation(params, rule, False)
  assert h_cache == h_full
  for a, b in zip(t_cache, t_full):
    assert a.keys() == b.keys()
    for i in a:
      assert a[i][0] == b[i][0]
      np.testing.assert_allclose(a[i][1], b[i][1], atol=1e-5)
  # And the log-probs are those of one full forward over the final transcript.
  for i, h in enumerate(h_cache):
    ref = _full_logps(params, h)
    pos = len(PROMPTS[i])
    for t, turn in enumerate(t_cache):
      if i not in turn:
        continue
      toks, lps, _ = turn[i]
      np.testing.assert_allclose(lps, ref[pos:pos + len(toks)], atol=1e-4)
      pos += len(toks) + (len(OBS[t + 1][i] or []) if t + 1 < 3 else 0)


@pytest.mark.parametrize("layer_cache,decode_layout", [("per_layer", "feature_major"),
                                                       ("stacked", "batch_major")])
def test_slot_refill_equals_each_request_alone(params, layer_cache, decode_layout):
  rule = SamplingConfig(temperature=1.0, eos_id=-1, eos_ids=(7, 9))
  base = jax.random.key(5)
  reqs = [Request([3 + i] * (2 + 3 * i), 4 + 5 * (i % 3), jax.random.fold_in(base, i))
          for i in range(6)]
  # Two slots only, a small cache: forces refills; a refill extends one row alone.
  eng = _engine(params, rule, max_len=64, layer_cache=layer_cache, decode_layout=decode_layout)
  assert eng.feature_major == (decode_layout == "feature_major")
  together = serve(eng, reqs, slots=[1, 3])
  assert {c.slot for c in together} == {1, 3}
  assert any(p[0] == "extend" and p[1] == 2 for p in eng.programs)
  # Every finished request released its row: the rows are empty again.
  assert not eng.lengths.any() and not np.asarray(eng.state.lengths).any()
  alone_eng = _engine(params, rule, max_len=64, layer_cache=layer_cache)
  for r, c in zip(reqs, together):
    (a,) = serve(alone_eng, [r], slots=[0])
    assert a.tokens == c.tokens and a.finished == c.finished
    np.testing.assert_allclose(a.logprobs, c.logprobs, atol=1e-5)
    assert len(c.tokens) <= r.max_new_tokens
    if c.finished:
      assert c.tokens[-1] in (7, 9)
    ref = _full_logps(params, list(r.prompt) + c.tokens)[len(r.prompt):]
    np.testing.assert_allclose(c.logprobs, ref, atol=1e-4)
  assert len({p for p in eng.programs if p[0] == "decode"}) == 1


def test_stop_string_spanning_tokens_truncates_cache(params):
  # A toy detokenizer: id -> one character; the stop string spans two tokens.
  greedy = SamplingConfig(temperature=0.0, eos_id=-1)
  eng = _engine(params, greedy)
  eng.extend({0: PROMPTS[0]}, {0: jax.random.key(0)})
  free_run = eng.decode({0: 24})[0][0]
  stop = chr(64 + free_run[5] % 60) + chr(64 + free_run[6] % 60)
  detok = lambda ids: "".join(chr(64 + i % 60) for i in ids)
  first = next(j for j in range(1, len(free_run)) if stop in detok(free_run[:j + 1]))
  rule = SamplingConfig(temperature=0.0, eos_id=-1, stop=(stop,))
  eng = _engine(params, rule, detokenize=detok, chunk=4)
  eng.extend({0: PROMPTS[0]}, {0: jax.random.key(0)})
  toks, lps, hit = eng.decode({0: 24})[0]
  assert hit and toks == free_run[:first + 1]
  # The dropped tokens left the cache: continuing equals re-prefilling.
  eng.extend({0: [50, 51]})
  cont = eng.decode({0: 6})[0]
  ref = _engine(params, greedy)
  ref.extend({0: PROMPTS[0] + toks + [50, 51]}, {0: jax.random.key(0)})
  again = ref.decode({0: 6})[0]
  assert cont[0] == again[0]
  np.testing.assert_allclose(cont[1], again[1], atol=1e-5)


@pytest.mark.parametrize("layer_cache", ["per_layer", "stacked"])
def test_prefill_in_pieces_equals_one_piece_and_full_forward(params, layer_cache):
  # 16-token pieces: a 45-token prompt goes in 3 pieces, each attending over a
  # shorter cache prefix; later pieces run only the rows that still have tokens.
  rule = SamplingConfig(temperature=1.0, eos_id=-1)
  prompts = {0: list(range(3, 48)), 1: [9, 8, 7], 2: list(range(60, 80))}
  keys = {i: jax.random.key(20 + i) for i in prompts}
  outs = []
  for chunk in (16, 64):
    eng = _engine(params, rule, max_len=256, layer_cache=layer_cache, prefill_chunk=chunk,
                  group_extends=False)  # one call per piece (grouping: its own test)
    eng.extend(prompts, keys)
    outs.append(eng.decode({i: 12 for i in prompts}))
    spans = sorted({p[3] for p in eng.programs if p[0] == "extend"})
    assert spans == ([16, 32, 64] if chunk == 16 else [64])
    rows = sorted({p[1] for p in eng.programs if p[0] == "extend"})
    assert rows == ([2, 4] if chunk == 16 else [4])
  for i, prompt in prompts.items():
    assert outs[0][i][0] == outs[1][i][0]
    np.testing.assert_allclose(outs[0][i][1], outs[1][i][1], atol=1e-5)
    ref = _full_logps(params, prompt + outs[0][i][0])[len(prompt):]
    np.testing.assert_allclose(outs[0][i][1], ref, atol=1e-4)
  with pytest.raises(ValueError, match="prefill_chunk=24"):
    _engine(params, rule, prefill_chunk=24)


@pytest.mark.parametrize("layer_cache", ["per_layer", "stacked"])
def test_extend_at_the_end_of_a_full_row_keeps_its_history(params, layer_cache):
  # Row 0 holds 58 of its 64 tokens; a 20-token chunk on row 1 makes the piece
  # 32 wide, so row 0's 3 tokens are written from entry 80 - 32 = 48 (rewriting
  # its entries 48-57 with their own values); row 2 takes nothing and keeps its cache.
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  eng = _engine(params, rule, max_len=64, layer_cache=layer_cache)
  assert eng.cache_len == 80
  hist = {0: list(range(3, 61)), 1: [7, 8, 9], 2: list(range(100, 130))}
  eng.extend(hist, {b: jax.random.key(b) for b in hist})
  add = {0: [61, 62, 63], 1: list(range(140, 160))}
  eng.extend(add)
  for b in add:
    hist[b] += add[b]
  out = eng.decode({0: 3, 1: 5, 2: 4})
  assert list(eng.lengths[:3]) == [64, 28, 34]
  for b, (toks, logps, _) in out.items():
    ref = _full_logps(params, hist[b] + toks, width=128)[len(hist[b]):]
    np.testing.assert_allclose(logps, ref, atol=1e-4)
  with pytest.raises(ValueError, match="Slot 0 holds 64 tokens and needs 1 more"):
    eng.extend({0: [5]})


def test_layer_cache_and_decode_layout_choices_are_checked(params):
  rule = SamplingConfig(temperature=0.0)
  with pytest.raises(ValueError, match="layer_cache='flat'"):
    _engine(params, rule, layer_cache="flat")
  with pytest.raises(ValueError, match="decode_layout='rows'"):
    _engine(params, rule, decode_layout="rows")
  eng = _engine(params, rule)
  assert eng.per_layer and eng.feature_major  # CPU defaults
  qkv = eng.decode_params["layers"][0]["qkv"]
  assert qkv.shape == ((CFG.num_heads + 2 * CFG.num_kv_heads) * CFG.head_dim, CFG.d_model)
  plain = _engine(params, rule, decode_layout="batch_major")
  assert not plain.feature_major and plain.decode_params is plain.params


def test_cache_past_one_block_rounds_max_len_plus_the_spare_entry(params):
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  for want, cache in ((576, 768), (640, 768), (767, 768), (768, 1024), (300, 512), (250, 256)):
    eng = _engine(params, rule, max_len=want)
    assert (eng.cache_len, eng.max_len) == (cache, cache - 1)
  eng = _engine(params, rule, max_len=200)
  assert (eng.cache_len, eng.max_len) == (224, 208)


def test_decode_needs_fresh_logits_and_room(params):
  eng = _engine(params, SamplingConfig(temperature=0.0, eos_id=-1), max_len=32)
  with pytest.raises(ValueError, match="no fresh logits"):
    eng.decode({0: 4})
  with pytest.raises(ValueError, match="beyond the cache"):
    eng.extend({0: list(range(3, 40))}, {0: jax.random.key(0)})


def test_min_p_and_top_k_rules_match_truncated_distribution():
  probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
  n = 4000
  logits = jnp.log(jnp.asarray(probs, jnp.float32))[None].repeat(n, 0)
  keys = row_keys(jax.random.key(3), n)
  pos = jnp.zeros((n,), jnp.int32)
  got = np.asarray(draw(logits, keys, pos, (MinP(0.3),)))  # keeps p >= 0.12
  freq = np.bincount(got, minlength=6) / n
  want = np.r_[probs[:3] / probs[:3].sum(), 0, 0, 0]
  assert freq[3:].sum() == 0
  np.testing.assert_allclose(freq, want, atol=0.03)
  got = np.asarray(draw(logits, keys, pos, SamplingConfig(top_k=2, min_p=0.0)))
  np.testing.assert_allclose(np.bincount(got, minlength=6) / n,
                             np.r_[probs[:2] / probs[:2].sum(), 0, 0, 0, 0], atol=0.03)
  assert TopK(2) in SamplingConfig(top_k=2).rules()


@pytest.mark.slow
def test_sharded_engine_matches_single_device_and_takes_new_params(params):
  mesh = parallel.make_mesh(parallel.MeshConfig(data=4, fsdp=1, tensor=2, rules="fsdp_tensor"))
  rules = parallel.RULE_SETS["fsdp_tensor"]
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  sharded = _engine(params, rule, mesh=mesh, rules=rules)  # per-layer buffers on CPU
  assert not sharded.feature_major  # "auto" on a mesh
  assert len(sharded.state.cache["k"]) == CFG.num_layers
  assert sharded.state.cache["k"][0].sharding.spec[:2] in (("data", "tensor"),
                                                           (("data",), "tensor"))
  stacked = _engine(params, rule, mesh=mesh, rules=rules, layer_cache="stacked",
                    decode_layout="feature_major")
  assert stacked.state.cache["k"].sharding.spec[1] in ("data", ("data",))
  assert stacked.state.cache["k"].sharding.spec[2] == "tensor"
  plain = _engine(params, rule)
  for eng in (sharded, stacked, plain):
    eng.extend({i: p for i, p in enumerate(PROMPTS)},
               {i: jax.random.key(i) for i in range(3)})
  a, b = sharded.decode({i: 8 for i in range(3)}), plain.decode({i: 8 for i in range(3)})
  c = stacked.decode({i: 8 for i in range(3)})
  assert all(a[i][0] == b[i][0] == c[i][0] for i in range(3))
  # Handoff: a differently laid out tree (replicated) is resharded on device.
  new = jax.tree.map(lambda x: x * 1.5, params)
  sharded.set_params(new)
  leaf = sharded.params["layers"]["q"]
  assert leaf.sharding.spec == parallel.logical_to_spec(
      ("layers", "embed", "heads", "head_dim"), leaf.shape, mesh, rules)


@pytest.mark.parametrize("decode_layout", ["feature_major", "batch_major"])
def test_bfloat16_model_generates_on_cpu(decode_layout):
  cfg = dataclasses.replace(CFG, param_dtype="bfloat16", compute_dtype="bfloat16")
  p = init_params(jax.random.key(1), cfg)
  eng = Engine(cfg, p, slots=2, max_len=64, rule=SamplingConfig(temperature=0.0, eos_id=-1),
               decode_layout=decode_layout)
  assert eng.state.cache["k"][0].dtype == jnp.bfloat16
  eng.extend({0: list(range(3, 40)), 1: [5, 6]}, {0: jax.random.key(0), 1: jax.random.key(1)})
  out = eng.decode({0: 6, 1: 6})
  assert all(len(out[b][0]) == 6 and np.isfinite(out[b][1]).all() for b in (0, 1))


@pytest.mark.parametrize("decode_layout", ["feature_major", "batch_major"])
def test_decode_on_a_subset_of_rows_equals_every_row(params, decode_layout):
  # Three active rows of eight decode on a 4-row gather of their cache: same tokens and
  # log-probs as decoding all eight rows, and the other rows' caches are left as they were.
  rule = SamplingConfig(temperature=1.0, eos_id=-1, eos_ids=(7,))
  base = jax.random.key(11)
  out = {}
  for subset in (True, False):
    eng = _engine(params, rule, max_len=96, slots=8, decode_layout=decode_layout,
                  decode_subset=subset)
    eng.extend({b: [3 + b] * (4 + b) for b in range(8)},
               {b: jax.random.fold_in(base, b) for b in range(8)})
    before = jax.tree.map(np.asarray, eng.state.cache)
    res = eng.decode({0: 20, 2: 9, 5: 30})
    # Decode again on top (their caches must hold what they emitted).
    res2 = eng.decode({b: 6 for b in (0, 2, 5) if not res[b][2]} or {1: 6})
    after = jax.tree.map(np.asarray, eng.state.cache)
    for b in (1, 3, 4, 6, 7) if subset else ():  # (a full-width step writes a spare entry)
      if b in res2:
        continue
      for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(x[b] if x.ndim == 4 else x[:, b],
                                      y[b] if y.ndim == 4 else y[:, b])
    kinds = {p for p in eng.programs if p[0] == "decode"}
    assert any(len(p) == 3 and p[2] == 4 for p in kinds) == subset
    out[subset] = (res, res2, eng.lengths.copy())
  (r1, r2, n1), (s1, s2, n2) = out[True], out[False]
  np.testing.assert_array_equal(n1, n2)
  for a, b in ((r1, s1), (r2, s2)):
    _assert_same_decode(a, b)


def _assert_same_decode(a, b):
  """Two `Engine.decode` results: the same rows, tokens and stop flags, log-probs to 1e-5."""
  assert a.keys() == b.keys()
  for k in a:
    assert a[k][0] == b[k][0] and a[k][2] == b[k][2]
    np.testing.assert_allclose(a[k][1], b[k][1], atol=1e-5)


def test_decode_narrows_as_rows_finish(params, monkeypatch):
  # Eight rows, six with a 3-token budget and two with 20: once six have finished the
  # loop leaves and the two go on in a 2-row program (a 2-row decode program is used;
  # no call runs all 8 rows past step 3), with the same tokens, log-probs, stop flags
  # and cache as decoding every row to the end. (By default nothing narrows below 8
  # rows; the floor is lowered here to keep the test small.)
  assert [engine_lib._narrower(w) for w in (4, 8, 9, 16, 24, 64)] == [0, 0, 8, 8, 16, 32]
  rule = SamplingConfig(temperature=1.0, eos_id=-1)
  base = jax.random.key(3)
  # By default 16 rows narrow to 8, and the 3 rows left go on in the 8-row program.
  eng = _engine(params, rule, max_len=96, slots=16)
  eng.extend({b: [3 + b] * 4 for b in range(16)}, {b: jax.random.fold_in(base, b)
                                                   for b in range(16)})
  eng.decode({b: 3 if b < 13 else 20 for b in range(16)})
  assert {p[2] for p in eng.programs if p[0] == "decode" and len(p) == 3} == {8}, eng.programs
  monkeypatch.setattr(engine_lib, "NARROW_MIN", 2)
  out = {}
  for subset in (True, False):
    eng = _engine(params, rule, max_len=96, slots=8, decode_subset=subset)
    eng.extend({b: [3 + b] * (4 + b) for b in range(8)},
               {b: jax.random.fold_in(base, b) for b in range(8)})
    res = eng.decode({b: 3 if b < 6 else 20 for b in range(8)})
    kinds = {p for p in eng.programs if p[0] == "decode"}
    assert any(len(p) == 3 and p[2] == 2 for p in kinds) == subset, kinds
    out[subset] = (res, eng.lengths.copy(), jax.tree.map(np.asarray, eng.state.cache))
  (r1, n1, c1), (r2, n2, c2) = out[True], out[False]
  np.testing.assert_array_equal(n1, n2)
  assert [len(r1[b][0]) for b in range(8)] == [3] * 6 + [20] * 2
  _assert_same_decode(r1, r2)
  # Each row's own entries (a full-width step also writes a spare one): keys are cached
  # length-last, values [.., S, E]; per-layer buffers are [B, ...], stacked [L, B, ...].
  for name, cut in (("k", lambda a, n: a[..., :n]), ("v", lambda a, n: a[..., :n, :])):
    for x, y in zip(jax.tree.leaves(c1[name]), jax.tree.leaves(c2[name])):
      for b in range(8):
        row = (lambda a: a[b]) if x.ndim == 4 else (lambda a: a[:, b])
        n = int(n1[b])
        np.testing.assert_allclose(cut(row(x), n), cut(row(y), n), atol=1e-6)


def test_grouped_extends_equal_one_padded_extend(params):
  # Observations of 3, 5, 40 and 70 tokens on 8 rows: grouped by length, the extend runs
  # as more than one call and computes fewer padded positions than one call padded to the
  # longest chunk, with the same logits, lengths and sampled continuations.
  rule = SamplingConfig(temperature=1.0, eos_id=-1, eos_ids=(7,))
  base = jax.random.key(5)
  out = {}
  for grouped in (True, False):
    eng = _engine(params, rule, max_len=192, slots=8, group_extends=grouped)
    eng.extend({b: [3 + b] * (6 + b) for b in range(8)},
               {b: jax.random.fold_in(base, b) for b in range(8)})
    before = list(eng.extend_positions)
    calls = len([p for p in eng.programs if p[0] == "extend"])
    eng.extend({0: [9] * 3, 1: [10] * 5, 4: [11] * 40, 6: [12] * 70, 7: [13] * 4})
    positions = [a - b for a, b in zip(eng.extend_positions, before)]
    assert positions[0] == 3 + 5 + 40 + 70 + 4
    logits = np.asarray(eng.state.logits)
    res = eng.decode({b: 12 for b in (0, 1, 4, 6, 7)})
    out[grouped] = (positions, logits, res, eng.lengths.copy(),
                    len([p for p in eng.programs if p[0] == "extend"]) - calls)
  (p1, l1, r1, n1, c1), (p2, l2, r2, n2, c2) = out[True], out[False]
  assert p1[1] < p2[1] and c1 > c2, (p1, p2, c1, c2)
  np.testing.assert_array_equal(n1, n2)
  np.testing.assert_allclose(l1, l2, atol=1e-4)
  for k in r1:
    assert r1[k][0] == r2[k][0] and r1[k][2] == r2[k][2]
    np.testing.assert_allclose(r1[k][1], r2[k][1], atol=1e-5)


def test_extend_groups_merge_when_one_call_is_cheaper(params):
  rule = SamplingConfig(temperature=0.0, eos_id=-1)
  eng = _engine(params, rule, max_len=256, slots=16)
  # Equal buckets: one group. Near buckets with few rows: merged (a second call costs more).
  assert eng._extend_groups({b: [1] * 20 for b in range(6)}) == [list(range(6))]
  assert eng._extend_groups({0: [1] * 20, 1: [1] * 40}) == [[0, 1]]
  # Many short rows and a few long ones: two calls.
  chunks = {b: [1] * 10 for b in range(8)}
  chunks.update({8: [1] * 120, 9: [1] * 100})
  assert eng._extend_groups(chunks) == [list(range(8)), [8, 9]]
  eng.group_extends = False
  assert eng._extend_groups(chunks) == [list(range(10))]
