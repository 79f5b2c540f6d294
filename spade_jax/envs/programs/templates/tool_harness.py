"""The tool-use harness: the `step()` of every tool-use env program (docs/METHOD.md §5).

This file is not imported by the library: :mod:`spade_jax.envs.tools` appends its text to
a designer's tool-use program, and the combination runs only inside a sandbox worker. It
therefore uses nothing but the standard library's `json` and `re`.

A tool-use program defines the domain; this harness runs the conversation:

* ``reset()`` calls the program's own ``reset(seed)``, which sets ``self.tools`` (JSON tool
  schemas), ``self.tasks`` (3-5 pairs of a user message and a criterion: a function of no
  arguments, or of ``self``, that says whether the request has been carried out) and any
  hidden state. The first user message is the observation; ``info`` carries the tools (the
  agent's system turn declares them), the message, and the reset gate: each criterion
  evaluated on the reset state (``gate_errors`` lists those that raised).
* ``step(turn)`` takes the agent's whole turn. Every ``<tool_call>{...}</tool_call>`` outside
  ``<think>`` runs in order against ``tool_<name>(**arguments)``; a malformed call, an
  unknown tool or bad arguments give an error result and count as malformed. Then, while
  the current task's criterion holds, the next user message is revealed. A turn with
  ``<answer>...</answer>`` and no tool call ends the episode: reward 1.0 when the answer is
  "done" and every criterion was met, else 0.0. A turn with neither asks the program's
  optional ``respond(text)`` for a user reply (e.g. a missing parameter).
* ``info`` of a step: ``tool_results`` (name and content per call), ``user`` (the revealed
  or replied message, or None), ``malformed`` (count), ``tasks_done`` / ``tasks_total``.
"""

import json as _spade_json
import re as _spade_re

_SPADE_THINK = _spade_re.compile(r"<think>.*?</think>", _spade_re.S)
_SPADE_CALL = _spade_re.compile(r"<tool_call>(.*?)</tool_call>", _spade_re.S)
_SPADE_ANSWER = _spade_re.compile(r"<answer>(.*?)</answer>", _spade_re.S)
# The sandbox host defines SpadeContractError: a breach raised with it is reported as failure
# kind "contract" (with its message), not as a crash of the program.
_SpadeContract = globals().get("SpadeContractError", ValueError)
_SPADE_NUDGE = ("Please continue: call the tools you need, or reply <answer>done</answer> "
                "once every request has been carried out.")


def _spade_got(value):
  """A short description of a bad ``self.tools`` / ``self.tasks`` value."""
  if isinstance(value, (list, tuple)):
    return "%s of %d" % (type(value).__name__, len(value))
  return type(value).__name__


def _spade_tool_env(base):
  """The harness as a subclass of the program's env class."""

  class SpadeToolUseEnv(base):  # pylint: disable=missing-class-docstring

    def reset(self, seed=None, options=None):
      try:
        base.reset(self, seed=seed, options=options)
      except TypeError:
        base.reset(self, seed)
      tools, tasks = getattr(self, "tools", None), getattr(self, "tasks", None)
      if not isinstance(tools, list) or not tools or not all(
          isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise _SpadeContract("reset() must set self.tools to a non-empty list of JSON tool "
                             "schemas, each a dict with a 'name'; got %s" % _spade_got(tools))
      for t in tools:
        if not callable(getattr(self, "tool_" + t["name"], None)):
          raise _SpadeContract("tool %r has no method tool_%s" % (t["name"], t["name"]))
      if not isinstance(tasks, list) or not 3 <= len(tasks) <= 5 or not all(
          isinstance(t, (list, tuple)) and len(t) == 2 and isinstance(t[0], str)
          and callable(t[1]) for t in tasks):
        raise _SpadeContract("reset() must set self.tasks to 3-5 (user message, criterion) "
                             "pairs; the criterion is a function returning a bool; got %s"
                             % _spade_got(tasks))
      self._spade_done = 0
      self._spade_turns = 0
      gate, errors = [], []
      for i, (_, criterion) in enumerate(tasks):
        try:
          gate.append(bool(self._spade_check(criterion)))
        except Exception as e:  # pylint: disable=broad-except
          gate.append(False)
          errors.append("criterion %d raised %s: %s" % (i + 1, type(e).__name__, e))
      info = {"tools": tools, "user": tasks[0][0], "tasks_total": len(tasks),
              "satisfied_at_reset": gate, "gate_errors": errors}
      return tasks[0][0], info

    def _spade_check(self, criterion):
      return criterion()

    def _spade_advance(self):
      """Marks every criterion that now holds, in order; returns the newly revealed request."""
      tasks, before = self.tasks, self._spade_done
      while self._spade_done < len(tasks) and self._spade_check(tasks[self._spade_done][1]):
        self._spade_done += 1
      if self._spade_done > before and self._spade_done < len(tasks):
        return tasks[self._spade_done][0]
      return None

    def _spade_call(self, text):
      try:
        call = _spade_json.loads(text)
        name, args = call["name"], call.get("arguments", {})
        if isinstance(args, str):
          args = _spade_json.loads(args)
        if not isinstance(name, str) or not isinstance(args, dict):
          raise ValueError("name must be a string and arguments an object")
      except (ValueError, KeyError, TypeError) as e:
        return None, "Error: malformed tool call (%s). Write <tool_call>{\"name\": ..., " \
                     "\"arguments\": {...}}</tool_call> with valid JSON." % e
      method = getattr(self, "tool_" + name, None)
      if not any(t["name"] == name for t in self.tools) or not callable(method):
        return name, "Error: unknown tool %r; available: %s" % (
            name, ", ".join(t["name"] for t in self.tools))
      try:
        return name, str(method(**args))
      except TypeError as e:
        return name, "Error: bad arguments for %s: %s" % (name, e)

    def step(self, action):
      self._spade_turns += 1
      text = _SPADE_THINK.sub("", str(action))
      calls = _SPADE_CALL.findall(text)
      answer = _SPADE_ANSWER.findall(text)
      results, malformed = [], 0
      for raw in calls:
        name, content = self._spade_call(raw.strip())
        if content.startswith("Error:"):
          malformed += 1
        results.append({"name": name or "", "content": content})
      user = self._spade_advance()
      info = {"tool_results": results, "user": user, "malformed": malformed,
              "tasks_done": self._spade_done, "tasks_total": len(self.tasks)}
      if answer and not calls:
        ok = answer[-1].strip().lower() == "done" and self._spade_done == len(self.tasks)
        return ("Task complete." if ok else "Not complete."), float(ok), True, False, info
      if not calls and user is None:
        reply = getattr(self, "respond", None)
        reply = str(reply(text.strip())) if callable(reply) else _SPADE_NUDGE
        revealed = self._spade_advance()
        info["user"] = reply + ("\n\n" + revealed if revealed else "")
        info["tasks_done"] = self._spade_done
      truncated = self._spade_turns >= getattr(self, "max_turns", 25)
      obs = "\n".join(["[%s] %s" % (r["name"] or "tool", r["content"]) for r in results]
                      + (["[user] " + info["user"]] if info["user"] else []))
      return obs, 0.0, False, truncated, info

  return SpadeToolUseEnv
