"""Tool use: an online shop. Place an order within a budget, refuse an impossible request."""

import json
import random

_ITEMS = ("lamp", "mug", "kettle", "scarf", "notebook", "pen", "chair", "clock")


def _call(name, **arguments):
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class ShopOrdersEnv:
  """Cart and orders; one request asks for something no tool can do."""

  def __init__(self, max_turns: int = 25, **kwargs):
    self.max_turns = max_turns

  def reset(self, seed=None, options=None):
    rng = random.Random(seed)
    items = rng.sample(_ITEMS, 5)
    self.prices = {it: rng.randint(3, 40) for it in items}
    self.stock = {it: rng.randint(0, 3) for it in items}
    self.cart, self.orders, self.talked = {}, [], False
    cheap = sorted(items, key=lambda it: (self.prices[it], it))
    self.target = next((it for it in cheap if self.stock[it] > 0), cheap[0])
    self.stock[self.target] = max(self.stock[self.target], 2)
    self.other = next(it for it in items if it != self.target)
    self.stock[self.other] = max(self.stock[self.other], 1)
    self.tools = [
        {"name": "catalog", "description": "Prices and stock of every item.",
         "parameters": {"type": "object", "properties": {}}},
        {"name": "add_to_cart", "description": "Add a quantity of an item to the cart.",
         "parameters": {"type": "object", "properties": {
             "item": {"type": "string"}, "quantity": {"type": "integer"}},
                        "required": ["item", "quantity"]}},
        {"name": "checkout", "description": "Order the cart's contents and empty it.",
         "parameters": {"type": "object", "properties": {}}},
    ]
    self.tasks = [
        ("Order two of the cheapest item that is in stock.",
         lambda: any(o.get(self.target) == 2 and len(o) == 1 for o in self.orders)),
        ("Also gift-wrap that order, please.",
         lambda: self.talked and len(self.orders) == 1),
        (f"Then order one {self.other}.",
         lambda: len(self.orders) == 2 and self.orders[1] == {self.other: 1}),
    ]
    return "", {}

  def respond(self, text):
    if "wrap" in text.lower() or "cannot" in text.lower() or "can't" in text.lower():
      self.talked = True
      return "Understood, no gift wrap then."
    return "Please handle my requests with the tools."

  def tool_catalog(self):
    return json.dumps({it: {"price": p, "stock": self.stock[it]} for it, p in self.prices.items()})

  def tool_add_to_cart(self, item, quantity):
    if item not in self.prices:
      return f"Error: no item {item!r}"
    if not isinstance(quantity, int) or quantity < 1:
      return "Error: quantity must be a positive integer"
    if self.cart.get(item, 0) + quantity > self.stock[item]:
      return f"Error: only {self.stock[item]} {item} in stock"
    self.cart[item] = self.cart.get(item, 0) + quantity
    return json.dumps(self.cart)

  def tool_checkout(self):
    if not self.cart:
      return "Error: the cart is empty"
    for it, q in self.cart.items():
      self.stock[it] -= q
    self.orders.append(dict(self.cart))
    self.cart = {}
    return f"order {len(self.orders)} placed"

  def solution(self):
    return [_call("add_to_cart", item=self.target, quantity=2) + _call("checkout"),
            "Sorry, I cannot gift-wrap: no tool does that.",
            _call("add_to_cart", item=self.other, quantity=1) + _call("checkout"),
            "<answer>done</answer>"]

  def hint(self):
    return ("Read the catalog first: the cheapest in-stock item decides the order, and a "
            "request no tool supports should be declined in plain words.")
