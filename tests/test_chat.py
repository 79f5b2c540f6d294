"""Qwen3 chat rendering, tokenizer.json loading, and the greedy generate launcher."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from spade_jax.models import ByteVocab, ChatTemplate, render_chat

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_render_thinking_tools_and_history():
  msgs = [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "<think>\nsum\n</think>\n\n4"},
      {"role": "user", "content": "add 1 and 2"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
      {"role": "tool", "content": "3"},
      {"role": "tool", "content": "ok"},
  ]
  text = render_chat(msgs, tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
  assert text == (
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
      "assist with the user query.\n\nYou are provided with function signatures within "
      "<tools></tools> XML tags:\n<tools>\n"
      '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}'
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
      '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
      "<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n4<|im_end|>\n"  # reasoning before the last query is dropped
      "<|im_start|>user\nadd 1 and 2<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n"
      '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>\n'
      "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\nok\n"
      "</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
  last = render_chat([{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "a", "reasoning_content": "r"}])
  assert last == ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n"
                  "</think>\n\na<|im_end|>\n")
  with pytest.raises(ValueError, match="Unknown chat role"):
    render_chat([{"role": "robot", "content": "x"}])


def test_incremental_template_equals_rendering():
  v = ByteVocab()
  assert v.decode(ChatTemplate(v, thinking=False).assistant_prefix()) == (
      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
  chat = ChatTemplate(v)
  ids = chat.prompt("sys", "hi", tools=TOOLS) + v.encode("ans") + [v.eos_id]
  ids += chat.continuation("res", role="tool")
  text = render_chat([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "ans"},
                      {"role": "tool", "content": "res"}],
                     tools=TOOLS, add_generation_prompt=True)
  eos = ids.index(v.eos_id)
  assert v.decode(ids[:eos]) + "<|im_end|>" + v.decode(ids[eos + 1:]) == text


def _tokenizer_dir(directory):
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=90, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["hello world, the model thinks"] * 20, trainer)
  tok.save(os.path.join(directory, "tokenizer.json"))


def test_tokenizer_json_round_trip(tmp_path):
  from spade_jax.models import load_tokenizer  # pylint: disable=g-import-not-at-top
  _tokenizer_dir(str(tmp_path))
  tok = load_tokenizer(str(tmp_path))
  assert tok.eos_id == tok.token_to_id("<|im_end|>") and tok.pad_id == 0
  ids = ChatTemplate(tok).prompt(None, "hello world")
  assert ids[0] == tok.token_to_id("<|im_start|>")
  e = ids.index(tok.eos_id)  # decode stops at the end-of-turn id
  assert tok.decode(ids) == "<|im_start|>user\nhello world"
  assert tok.decode(ids[e + 1:]) == "\n<|im_start|>assistant\n"
  assert tok.decode(ids[:3] + [tok.eos_id, 5]) == tok.decode(ids[:3])


def test_greedy_generate_launcher_matches_transformers(tmp_path):
  torch = pytest.importorskip("torch")
  tf = pytest.importorskip("transformers")
  torch.manual_seed(0)
  cfg = tf.Qwen3Config(vocab_size=90, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       intermediate_size=64, initializer_range=0.3,
                       max_position_embeddings=256, tie_word_embeddings=False)
  model = tf.Qwen3ForCausalLM(cfg).eval()
  model.save_pretrained(str(tmp_path))
  _tokenizer_dir(str(tmp_path))
  prompt = [5, 17, 33, 8, 61]
  with torch.no_grad():
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
  os.remove(tmp_path / "tokenizer.json")  # ids only: eos from config.json (none)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  out = subprocess.run(
      [sys.executable, "-m", "launch.generate", f"--hf_checkpoint={tmp_path}",
       "--prompt_ids=" + ",".join(map(str, prompt)), "--max_new_tokens=64",
       "--temperature=0"], capture_output=True, text=True, env=env, check=False,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.returncode == 0, out.stderr[-2000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert len(ref) == 64
  assert got["ids"] == ref, np.nonzero(np.array(got["ids"]) != np.array(ref))
