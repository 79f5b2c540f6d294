"""Tool use: a shared calendar. Book meetings in free slots, move one, ask for a missing time."""

import json
import random

_PEOPLE = ("ann", "raj", "lin", "omar", "sue")


def _call(name, **arguments):
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class CalendarMeetingsEnv:
  """Book and move meetings; one request leaves out the hour, which the user gives on asking."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    self.busy = {p: set(rng.sample(range(9, 17), 3)) for p in _PEOPLE}
    self.meetings = {}
    self.a, self.b, self.c = rng.sample(_PEOPLE, 3)
    free_ab = [h for h in range(9, 17) if h not in self.busy[self.a] | self.busy[self.b]]
    self.hour1 = free_ab[0] if free_ab else 17
    free_c = [h for h in range(9, 17) if h not in self.busy[self.c] and h != self.hour1]
    self.hour2 = rng.choice(free_c) if free_c else 8
    m = self.meetings
    self.tools = [
        {"name": "free_hours", "description": "Hours (9-16) when everyone listed is free.",
         "parameters": {"type": "object", "properties": {
             "people": {"type": "array", "items": {"type": "string"}}}, "required": ["people"]}},
        {"name": "book", "description": "Book a meeting at an hour for the people listed.",
         "parameters": {"type": "object", "properties": {
             "title": {"type": "string"}, "hour": {"type": "integer"},
             "people": {"type": "array", "items": {"type": "string"}}},
                        "required": ["title", "hour", "people"]}},
        {"name": "cancel", "description": "Cancel a meeting by title.",
         "parameters": {"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"]}},
    ]
    self.tasks = [
        (f"Book 'sync' for {self.a} and {self.b} at the earliest hour both are free.",
         lambda: m.get("sync", (None,))[0] == self.hour1),
        (f"Book 'review' with {self.c}; ask me for the hour.",
         lambda: m.get("review", (None,))[0] == self.hour2),
        ("Cancel 'sync', the plans changed.", lambda: "sync" not in m and "review" in m),
    ]
    return "", {}

  def respond(self, text):
    return f"Let's do {self.hour2} o'clock for the review."

  def tool_free_hours(self, people):
    if not isinstance(people, list) or any(p not in self.busy for p in people):
      return "Error: people must be a list of known names"
    taken = set().union(*(self.busy[p] for p in people))
    taken |= {h for h, ps in self.meetings.values() if set(ps) & set(people)}
    return json.dumps([h for h in range(9, 17) if h not in taken])

  def tool_book(self, title, hour, people):
    if title in self.meetings:
      return f"Error: {title!r} exists"
    if not isinstance(people, list) or any(p not in self.busy for p in people):
      return "Error: people must be a list of known names"
    if any(hour in self.busy[p] for p in people):
      return f"Error: someone is busy at {hour}"
    self.meetings[title] = (hour, list(people))
    return "ok"

  def tool_cancel(self, title):
    if self.meetings.pop(title, None) is None:
      return f"Error: no meeting {title!r}"
    return "ok"

  def solution(self):
    return [_call("book", title="sync", hour=self.hour1, people=[self.a, self.b]),
            "What hour should the review be?",
            _call("book", title="review", hour=self.hour2, people=[self.c]),
            _call("cancel", title="sync"),
            "<answer>done</answer>"]

  def hint(self):
    return ("Use free_hours with everyone invited and take the smallest hour; when an "
            "hour is missing, ask for it in plain text before booking.")
