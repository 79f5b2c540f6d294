"""How a suite talks to the model: conversations on a KV-cache engine, or a script.

Every suite drives its items as conversations through :func:`converse`, the same contract
as ``sampling.schedule``: each conversation starts with a :class:`~spade_jax.sampling.Turn`
(its prompt ids), and after every decode round ``respond`` says what each conversation that
decoded does next (append ids and decode again, e.g. a tool result) or that it has ended.
With a ``Sampler`` the conversations share one engine of ``batch_size`` rows (finished ones
are refilled at once); the history stays in the cache, never re-encoded.

:class:`ScriptedPolicy` answers the same contract from a Python function of the transcript
text, so a suite's scoring is checked end to end with known-correct and known-wrong answers
(and no model).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax

from spade_jax.sampling import Output, Sampler, Turn, schedule

Respond = Callable[[dict[int, Output]], dict[int, Turn | None]]


def sample_keys(seed: int, items: int, samples: int) -> list[jax.Array]:
  """Key of item i, sample s (index ``i * samples + s``): ``fold_in(fold_in(key(seed), i), s)``."""
  base = jax.random.key(seed)
  out = []
  for i in range(items):
    k = jax.random.fold_in(base, i)
    out.extend(jax.random.fold_in(k, s) for s in range(samples))
  return out


class ScriptedPolicy:
  """A stand-in policy: ``reply(transcript) -> text`` answers every assistant turn.

  The transcript is the conversation so far as text (chat markup included, the model's
  end-of-turn id shown as ``<|im_end|>``), ending with the assistant prefix. The reply is
  encoded, cut to the turn's token budget, and ends the turn (an end-of-turn id follows it
  when it fits).

  Args:
    vocab: the chat template's vocabulary (encode, decode, eos_id).
    reply: transcript text -> the assistant's text.
  """

  def __init__(self, vocab, reply: Callable[[str], str]):
    self.vocab, self.reply = vocab, reply

  def text(self, ids: Sequence[int]) -> str:
    """The transcript as text; ``decode`` stops at an end-of-turn id, so pieces are joined."""
    pieces, cur = [], []
    for i in ids:
      if i == self.vocab.eos_id:
        pieces.append(cur)
        cur = []
      else:
        cur.append(i)
    pieces.append(cur)
    return "<|im_end|>".join(self.vocab.decode(p) if p else "" for p in pieces)

  def converse(self, first: Sequence[Turn], respond: Respond) -> None:
    """Runs the conversations in lock step (see :func:`converse`)."""
    transcripts = {c: list(t.ids) for c, t in enumerate(first)}
    budget = {c: t.max_new_tokens for c, t in enumerate(first)}
    active = list(range(len(first)))
    while active:
      outputs = {}
      for c in active:
        ids = self.vocab.encode(self.reply(self.text(transcripts[c])))
        finished = len(ids) < budget[c]
        ids = ids[:budget[c]] + ([self.vocab.eos_id] if finished else [])
        transcripts[c] += ids
        outputs[c] = (ids, [0.0] * len(ids), finished)
      nxt = respond(outputs)
      active = []
      for c in outputs:
        turn = nxt.get(c)
        if turn is not None:
          transcripts[c] += list(turn.ids)
          budget[c] = turn.max_new_tokens
          active.append(c)


def sampler_for(policy: Sampler, cfg) -> Sampler:
  """``policy``'s parameters with the suite's sampling (its EOS, padding and stop rules kept)."""
  rule = dataclasses.replace(policy.rule, temperature=cfg.temperature, top_p=cfg.top_p,
                             top_k=cfg.top_k, min_p=0.0)
  return Sampler(policy.params, policy.cfg, rule, jax.random.key(cfg.seed),
                 detokenize=policy.detokenize, cache_dtype=policy.cache_dtype,
                 mesh=policy.mesh, rules=policy.rules)


def converse(policy, cfg, first: Sequence[Turn], keys: Sequence[jax.Array],
             respond: Respond, *, max_len: int, refill_early: bool = False) -> None:
  """Runs conversations on ``policy`` until every one has ended.

  Args:
    policy: a ``Sampler`` or a :class:`ScriptedPolicy`.
    cfg: the suite's config (sampling and ``batch_size``).
    first: each conversation's first turn (its prompt).
    keys: each conversation's key (see :func:`sample_keys`).
    respond: after each decode round, conversation -> output for those that decoded;
      returns conversation -> next turn, or None when it has ended.
    max_len: tokens one engine row holds at most (the longest transcript, turns included).
    refill_early: end a decode round as soon as one row stops while conversations wait
      (one-shot completions); see ``sampling.schedule``.
  """
  if not first:
    return
  if isinstance(policy, ScriptedPolicy):
    policy.converse(first, respond)
    return
  if not isinstance(policy, Sampler):
    raise TypeError(f"policy must be a spade_jax.sampling.Sampler or an "
                    f"eval.ScriptedPolicy; got {type(policy).__name__}.")
  engine = sampler_for(policy, cfg).engine(min(len(first), cfg.batch_size), max_len)
  schedule(engine, first, keys, respond, refill_early=refill_early)


def complete(policy, cfg, prompts: Sequence[Sequence[int]], *,
             progress: Callable[[int, int], None] | None = None) -> list[Output]:
  """``cfg.samples`` one-shot completions of each prompt (prompt-major order).

  Args:
    policy: a ``Sampler`` or a :class:`ScriptedPolicy`.
    cfg: the suite's config.
    prompts: token ids of each item's prompt.
    progress: called with (completions done, total) as completions finish.

  Returns:
    ``len(prompts) * cfg.samples`` outputs (ids, log-probs, stopped); item i's sample s
    is at ``i * cfg.samples + s``.
  """
  n = len(prompts) * cfg.samples
  if not n:
    return []
  first = [Turn(list(p), cfg.max_new_tokens) for p in prompts for _ in range(cfg.samples)]
  keys = sample_keys(cfg.seed, len(prompts), cfg.samples)
  out: list[Output] = [([], [], False) for _ in range(n)]
  left = [cfg.max_new_tokens] * n
  done = [0]

  def respond(outputs: dict[int, Output]) -> dict[int, Turn | None]:
    nxt: dict[int, Turn | None] = {}
    for c, (toks, logps, hit) in outputs.items():
      out[c] = (out[c][0] + list(toks), out[c][1] + list(logps), hit)
      left[c] -= len(toks)
      nxt[c] = None if hit or left[c] <= 0 else Turn((), left[c])
      done[0] += nxt[c] is None
    if progress is not None:
      progress(done[0], n)
    return nxt

  # A row holds one prompt and its completion.
  max_len = max(len(p) for p in prompts) + cfg.max_new_tokens
  converse(policy, cfg, first, keys, respond, max_len=max_len, refill_early=True)
  return out


def texts(policy, chat, cfg, users: Sequence[str], progress=None, system: str | None = None
          ) -> list[list[str]]:
  """``cfg.samples`` completions (text) of each user message, grouped per item.

  Args:
    policy: a ``Sampler`` or a :class:`ScriptedPolicy`.
    chat: the ``models.ChatTemplate`` that renders each prompt (system + user + the
      assistant prefix).
    cfg: the suite's config.
    users: each item's user message.
    progress: called with (completions done, total).
    system: the system message (None: no system turn).
  """
  prompts = [chat.prompt(system, u) for u in users]
  outs = complete(policy, cfg, prompts, progress=progress)
  decoded = [chat.vocab.decode(o[0]) for o in outs]
  return [decoded[i * cfg.samples:(i + 1) * cfg.samples] for i in range(len(users))]
