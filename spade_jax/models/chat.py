"""Qwen3 chat format, rendered by our own code over any vocabulary.

Two levels:

- `render_chat(messages, tools, ...)` produces the exact text of the Qwen3
  chat template for a whole conversation: system / user / assistant / tool
  turns, tool schemas in the system turn, `<tool_call>` blocks, thinking
  blocks (kept only after the last user query) and the generation prompt with
  thinking on or off.
- `ChatTemplate` builds conversations incrementally by concatenating token
  ids, never re-encoding earlier text, so a multi-turn transcript is exactly
  the sequence the sampler conditioned on and its log-probs stay valid for
  training. The model ends its own turn with `vocab.eos_id` (`<|im_end|>` for
  Qwen3 tokenizers); `turn_end` follows it in the history.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Protocol, Sequence

ROLES = ("system", "user", "assistant", "tool")
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
EMPTY_THINK = "<think>\n\n</think>\n\n"


class Vocab(Protocol):
  eos_id: int

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


def _tojson(x: Any) -> str:
  return json.dumps(x, ensure_ascii=False)


def _is_tool_response(content: str) -> bool:
  return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _split_thinking(msg: Mapping[str, Any], content: str) -> tuple[str, str]:
  """(reasoning, answer) of an assistant message."""
  if isinstance(msg.get("reasoning_content"), str):
    return msg["reasoning_content"], content
  if "</think>" in content:
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")
  return "", content


def _tool_calls(calls: Sequence[Mapping[str, Any]], content: str) -> str:
  out = []
  for i, call in enumerate(calls):
    call = call.get("function", call)
    args = call.get("arguments", {})
    args = args if isinstance(args, str) else _tojson(args)
    sep = "\n" if (i == 0 and content) or i > 0 else ""
    out.append(f'{sep}<tool_call>\n{{"name": "{call["name"]}", "arguments": {args}}}\n'
               "</tool_call>")
  return "".join(out)


def render_chat(messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None,
                add_generation_prompt: bool = False,
                enable_thinking: bool = True) -> str:
  """Text of a conversation in the Qwen3 chat format.

  Args:
    messages: dicts with "role" (system/user/assistant/tool) and "content";
      assistant messages may carry "reasoning_content" and "tool_calls"
      ([{"name", "arguments"}] or [{"function": {...}}]).
    tools: JSON tool schemas listed in the system turn.
    add_generation_prompt: end with the assistant prefix.
    enable_thinking: with False the generation prompt holds an empty
      `<think>` block, which switches Qwen3 thinking off.

  Returns:
    The rendered text (special tokens as markup).
  """
  for m in messages:
    if m.get("role") not in ROLES:
      raise ValueError(f"Unknown chat role {m.get('role')!r}; expected one of {ROLES}.")
  out = []
  first_system = bool(messages) and messages[0]["role"] == "system"
  if tools:
    out.append("<|im_start|>system\n")
    if first_system:
      out.append(messages[0]["content"] + "\n\n")
    out.append(TOOLS_PREAMBLE + "".join("\n" + _tojson(t) for t in tools)
               + TOOLS_POSTAMBLE + "<|im_end|>\n")
  elif first_system:
    out.append(f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n")
  last_query = len(messages) - 1
  for i in range(len(messages) - 1, -1, -1):
    c = messages[i].get("content")
    if messages[i]["role"] == "user" and isinstance(c, str) and not _is_tool_response(c):
      last_query = i
      break
  n = len(messages)
  for i, m in enumerate(messages):
    role = m["role"]
    content = m.get("content") if isinstance(m.get("content"), str) else ""
    if role == "user" or (role == "system" and i > 0):
      out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    elif role == "assistant":
      reasoning, content = _split_thinking(m, content)
      if i > last_query and (i == n - 1 or reasoning):
        out.append(f"<|im_start|>assistant\n<think>\n{reasoning.strip(chr(10))}\n"
                   f"</think>\n\n{content.lstrip(chr(10))}")
      else:
        out.append(f"<|im_start|>assistant\n{content}")
      out.append(_tool_calls(m.get("tool_calls") or [], content) + "<|im_end|>\n")
    elif role == "tool":
      if i == 0 or messages[i - 1]["role"] != "tool":
        out.append("<|im_start|>user")
      out.append(f"\n<tool_response>\n{content}\n</tool_response>")
      if i == n - 1 or messages[i + 1]["role"] != "tool":
        out.append("<|im_end|>\n")
  if add_generation_prompt:
    out.append("<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY_THINK))
  return "".join(out)


class ChatTemplate:
  """Incremental Qwen3 chat markup over any vocabulary (token-id concatenation).

  Args:
    vocab: tokenizer with encode/decode/eos_id.
    thinking: when False, every assistant prefix carries an empty think block
      (Qwen3 non-thinking mode).
  """

  def __init__(self, vocab: Vocab, thinking: bool = True):
    self.vocab = vocab
    self.thinking = thinking

  def message(self, role: str, text: str) -> list[int]:
    """A complete system, user or tool turn (tool results as Qwen3 tool responses)."""
    if role not in ("system", "user", "tool"):
      raise ValueError(f"Unknown chat role {role!r}; expected system, user or tool "
                       "(assistant turns are generated).")
    return self.vocab.encode(render_chat([{"role": role, "content": text}])
                             if role != "system" else
                             f"<|im_start|>system\n{text}<|im_end|>\n")

  def system(self, text: str | None, tools: Sequence[Mapping[str, Any]] | None = None
             ) -> list[int]:
    """System turn, with tool schemas when given (empty when neither is set)."""
    if not tools:
      return self.message("system", text) if text else []
    msgs = [{"role": "system", "content": text}] if text else []
    return self.vocab.encode(render_chat(msgs, tools=tools))

  def assistant_prefix(self) -> list[int]:
    return self.vocab.encode("<|im_start|>assistant\n"
                             + ("" if self.thinking else EMPTY_THINK))

  def turn_end(self) -> list[int]:
    return self.vocab.encode("\n")

  def prompt(self, system: str | None, user: str,
             tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """System (+ tools) + user messages followed by the assistant prefix."""
    return self.system(system, tools) + self.message("user", user) + self.assistant_prefix()

  def continuation(self, observation: str, role: str = "user") -> list[int]:
    """Tokens appended after an assistant turn: its end, a new message, the prefix."""
    return self.turn_end() + self.message(role, observation) + self.assistant_prefix()

  def continuation_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """After an assistant turn: its end, several tool and user messages (consecutive tool
    results share one user turn, as Qwen3 renders them), then the assistant prefix."""
    for m in messages:
      if m.get("role") not in ("tool", "user"):
        raise ValueError(f"continuation_messages takes tool and user messages; got role "
                         f"{m.get('role')!r}.")
    return self.turn_end() + self.vocab.encode(render_chat(list(messages))) + \
        self.assistant_prefix()
