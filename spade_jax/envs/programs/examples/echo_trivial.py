class EchoEnv:
  def reset(self, seed=None, options=None):
    return 'say 1', {}
  def step(self, action):
    return '', 1.0, True, False, {}
