"""Tool use: a library desk. Find books, lend them to the right members, collect a return."""

import json
import random

_TITLES = ("River Stone", "Night Glass", "Paper Moon", "Iron Garden", "Salt Road",
           "Quiet Engine", "Amber Sky", "Green Tower")
_MEMBERS = ("ada", "bo", "cy", "di", "ed")


def _call(name, **arguments):
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class LibraryLoansEnv:
  """Lend and return books through the library's tools."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    titles = rng.sample(_TITLES, 6)
    self.books = {100 + i: {"title": t, "on_loan_to": None} for i, t in enumerate(titles)}
    held = rng.choice(sorted(self.books))
    self.books[held]["on_loan_to"] = rng.choice(_MEMBERS)
    free = [b for b in sorted(self.books) if b != held]
    self.want1, self.want2 = rng.sample(free, 2)
    self.m1, self.m2 = rng.sample(_MEMBERS, 2)
    self.held = held
    self.tools = [
        {"name": "search", "description": "Books whose title contains the text.",
         "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}},
        {"name": "lend", "description": "Lend a book (by id) to a member.",
         "parameters": {"type": "object", "properties": {
             "book_id": {"type": "integer"}, "member": {"type": "string"}},
                        "required": ["book_id", "member"]}},
        {"name": "check_in", "description": "Record the return of a book (by id).",
         "parameters": {"type": "object", "properties": {"book_id": {"type": "integer"}},
                        "required": ["book_id"]}},
    ]
    b = self.books
    self.tasks = [
        (f"Please lend '{b[self.want1]['title']}' to member {self.m1}.",
         lambda: b[self.want1]["on_loan_to"] == self.m1),
        (f"'{b[held]['title']}' was just returned at the desk; check it in.",
         lambda: b[held]["on_loan_to"] is None),
        (f"Now lend '{b[self.want2]['title']}' and '{b[held]['title']}' to {self.m2}.",
         lambda: b[self.want2]["on_loan_to"] == self.m2 and b[held]["on_loan_to"] == self.m2),
    ]
    return "", {}

  def tool_search(self, text):
    hits = {i: v["title"] for i, v in self.books.items() if str(text).lower() in v["title"].lower()}
    return json.dumps(hits)

  def tool_lend(self, book_id, member):
    book = self.books.get(book_id)
    if book is None:
      return f"Error: no book {book_id}"
    if member not in _MEMBERS:
      return f"Error: unknown member {member!r}"
    if book["on_loan_to"] is not None:
      return f"Error: book {book_id} is on loan to {book['on_loan_to']}"
    book["on_loan_to"] = member
    return "ok"

  def tool_check_in(self, book_id):
    book = self.books.get(book_id)
    if book is None or book["on_loan_to"] is None:
      return f"Error: book {book_id} is not on loan"
    book["on_loan_to"] = None
    return "ok"

  def solution(self):
    return [_call("lend", book_id=self.want1, member=self.m1),
            _call("check_in", book_id=self.held),
            _call("lend", book_id=self.want2, member=self.m2)
            + _call("lend", book_id=self.held, member=self.m2),
            "<answer>done</answer>"]

  def hint(self):
    return ("Books are lent by id: search for each title first, and a returned book must "
            "be checked in before it can be lent again.")
