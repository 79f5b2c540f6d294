class TaskEnv:
  """One question, one answer turn: reward 1.0 for the right answer, else 0.0.

  SCORING "exact": the stripped last boxed answer after thinking, else the answer tag,
  equal to ANSWER as a string; "lenient": the answer wherever it reasonably is, numbers
  compared by value. info["strict"]: the last boxed answer was right.
  """

  def __init__(self, max_turns=1, **kwargs):
    self.max_turns = max_turns
    self.done = False

  def reset(self, seed=None, options=None):
    self.done = False
    return OBSERVATION, {}

  def step(self, action):
    if self.done:
      return "The task is over.", 0.0, True, False, {}
    self.done = True
    if SCORING == "lenient":
      right = score(action, ANSWER)["lenient"]
    else:
      right = final_answer(action)[0] == ANSWER
    info = {"strict": strict_answer(action) == ANSWER}
    if right:
      return "Correct.", 1.0, True, False, info
    return "Incorrect.", 0.0, True, False, info

  def solution(self):
    return ["\\boxed{" + ANSWER + "}"]
