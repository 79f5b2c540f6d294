"""Tool use: a bank's back office. Look up balances, move money, recover from a frozen account."""

import json
import random

_OWNERS = ("ana", "ben", "cleo", "dev", "eli")


def _call(name, **arguments):
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class BankTransfersEnv:
  """Move money between accounts; a frozen account must be unfrozen first."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    owners = rng.sample(_OWNERS, 3)
    self.accounts = {f"AC{rng.randint(100, 999)}{i}": {"owner": o, "balance": rng.randint(50, 400),
                                                        "frozen": False}
                     for i, o in enumerate(owners)}
    ids = sorted(self.accounts)
    self.src, self.dst, self.third = ids
    self.accounts[self.dst]["frozen"] = True
    self.amount = rng.randint(10, self.accounts[self.src]["balance"] // 2)
    self.start = {k: v["balance"] for k, v in self.accounts.items()}
    self.tools = [
        {"name": "find_account", "description": "Account ids of an owner.",
         "parameters": {"type": "object", "properties": {"owner": {"type": "string"}},
                        "required": ["owner"]}},
        {"name": "balance", "description": "Balance of an account.",
         "parameters": {"type": "object", "properties": {"account": {"type": "string"}},
                        "required": ["account"]}},
        {"name": "unfreeze", "description": "Unfreeze an account.",
         "parameters": {"type": "object", "properties": {"account": {"type": "string"}},
                        "required": ["account"]}},
        {"name": "freeze", "description": "Freeze an account.",
         "parameters": {"type": "object", "properties": {"account": {"type": "string"}},
                        "required": ["account"]}},
        {"name": "transfer", "description": "Move an amount between two accounts.",
         "parameters": {"type": "object", "properties": {
             "source": {"type": "string"}, "target": {"type": "string"},
             "amount": {"type": "integer"}}, "required": ["source", "target", "amount"]}},
    ]
    a, src, dst, third = self.accounts, self.src, self.dst, self.third
    half = self.start[third] // 2
    self.half = half
    self.tasks = [
        (f"Send {self.amount} from {a[src]['owner']}'s account to {a[dst]['owner']}.",
         lambda: a[dst]["balance"] == self.start[dst] + self.amount),
        (f"{a[third]['owner'].title()} wants to move half of their balance (rounded down) "
         f"to {a[src]['owner']}.",
         lambda: a[third]["balance"] == self.start[third] - half),
        (f"Finally, freeze {a[third]['owner']}'s account for a review.",
         lambda: a[third]["frozen"] and a[third]["balance"] == self.start[third] - half),
    ]
    return "", {}

  def tool_find_account(self, owner):
    return json.dumps([k for k, v in self.accounts.items() if v["owner"] == owner])

  def tool_balance(self, account):
    if account not in self.accounts:
      return f"Error: no account {account}"
    return str(self.accounts[account]["balance"])

  def tool_unfreeze(self, account):
    if account not in self.accounts:
      return f"Error: no account {account}"
    self.accounts[account]["frozen"] = False
    return "ok"

  def tool_freeze(self, account):
    if account not in self.accounts:
      return f"Error: no account {account}"
    self.accounts[account]["frozen"] = True
    return "ok"

  def tool_transfer(self, source, target, amount):
    a = self.accounts
    if source not in a or target not in a:
      return "Error: unknown account"
    if not isinstance(amount, int) or amount <= 0:
      return "Error: amount must be a positive integer"
    if a[source]["frozen"] or a[target]["frozen"]:
      return "Error: account frozen; unfreeze it first"
    if a[source]["balance"] < amount:
      return "Error: insufficient funds"
    a[source]["balance"] -= amount
    a[target]["balance"] += amount
    return "ok"

  def solution(self):
    return [_call("unfreeze", account=self.dst)
            + _call("transfer", source=self.src, target=self.dst, amount=self.amount),
            _call("transfer", source=self.third, target=self.src, amount=self.half),
            _call("freeze", account=self.third),
            "<answer>done</answer>"]

  def hint(self):
    return ("Find account ids by owner; a transfer into a frozen account fails until you "
            "unfreeze it, and halves are computed from the current balance.")
