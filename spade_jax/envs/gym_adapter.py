"""A ``gymnasium.Env`` over one sandboxed env program.

Registered as ``spade_jax/Program-v0``::

  import gymnasium, spade_jax.envs
  env = gymnasium.make("spade_jax/Program-v0", source=program_text)
  obs, info = env.reset(seed=0)
  obs, reward, terminated, truncated, info = env.step("My guess: \\boxed{50}")

Observations and actions are ``Text`` spaces. The program runs in a sandbox
worker (never in this process); a sandbox failure (crash, timeout, contract
breach) ends the episode with ``terminated=True``, reward 0 and
``info["sandbox_reason"]`` / ``info["sandbox_detail"]`` set, and the next
``reset`` starts a fresh worker.

Seeding: ``reset(seed=s)`` passes ``s`` to the program; ``reset()`` without a
seed passes a seed drawn from ``self.np_random``, so episodes stay
reproducible from the first seed.
"""

import dataclasses
import string
from typing import Any

import gymnasium
from gymnasium import spaces

from spade_jax.envs import tools as tools_lib
from spade_jax.envs.contract import SETTINGS
from spade_jax.sandbox import EnvHandle, EnvPool, SandboxConfig

ENV_ID = "spade_jax/Program-v0"


class UnicodeText(spaces.Text):
  """``Text`` space holding any ``str`` of bounded length.

  ``spaces.Text`` only admits characters of its (sampling) charset; env
  observations are free-form text, so membership here checks type and length
  only. Samples are drawn from printable ASCII.
  """

  def contains(self, x: Any) -> bool:
    return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, UnicodeText) and super().__eq__(other)


class ProgramEnv(gymnasium.Env):
  """A sandboxed env program as a gymnasium environment.

  Args:
    source: env program source (already extracted).
    max_turns: passed to the program's ``__init__``.
    pool: pool to run in; when None the env owns a small pool, closed by
      ``close()``.
    sandbox_config: config of the owned pool.
    max_action_chars: length bound of the action space.
    render_mode: None or "ansi" (returns the last observation).
    env_kwargs: extra keyword arguments for the program's ``__init__``.
    setting: the program's setting (``envs.SETTINGS``); a tool-use program runs under the
      tool-use harness, so an action is the agent's whole turn (tool calls or an answer)
      and ``info`` carries the tool results, the revealed request and the tools.
  """

  metadata = {"render_modes": ["ansi"], "render_fps": 1}

  def __init__(self, source: str, max_turns: int = 25, pool: EnvPool | None = None,
               sandbox_config: SandboxConfig | None = None, max_action_chars: int = 8192,
               render_mode: str | None = None, env_kwargs: dict[str, Any] | None = None,
               setting: str = "games"):
    if not isinstance(source, str) or not source.strip():
      raise ValueError("ProgramEnv needs source=<env program text>; got "
                       f"{type(source).__name__} {str(source)[:40]!r}.")
    if render_mode not in (None, "ansi"):
      raise ValueError(f"render_mode={render_mode!r}; expected None or 'ansi'.")
    SETTINGS.check(setting)
    self.source, self.setting = source, setting
    self.max_turns = max_turns
    self.render_mode = render_mode
    self._env_kwargs = dict(env_kwargs or {})
    self._owns_pool = pool is None
    if pool is None:
      cfg = sandbox_config or SandboxConfig()
      pool = EnvPool(dataclasses.replace(cfg, num_workers=0, self_test=False))
    self._pool = pool
    cap = pool.config.max_observation_chars
    self.observation_space = UnicodeText(cap, min_length=0, charset=string.printable)
    self.action_space = UnicodeText(max_action_chars, min_length=0,
                                    charset=string.ascii_letters + string.digits + " ")
    self._handle: EnvHandle | None = None
    self._last_obs = ""
    self._closed = False

  def _ensure_handle(self) -> EnvHandle:
    if self._handle is None or not self._handle.alive:
      if self._handle is not None:
        self._pool.release([self._handle])
      self._handle = tools_lib.start(self._pool, [self.source], self.setting, self.max_turns,
                                     kwargs=self._env_kwargs)[0]
    return self._handle

  @staticmethod
  def _error_info(reason: str | None, detail: str) -> dict[str, Any]:
    return {"sandbox_reason": reason or "crash", "sandbox_detail": detail}

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
            ) -> tuple[str, dict[str, Any]]:
    super().reset(seed=seed)
    program_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
    handle = self._ensure_handle()
    res = self._pool.reset_many([handle], seeds=[program_seed], options=options)[0]
    if not res.ok:
      self._last_obs = ""
      return "", self._error_info(res.reason, res.detail)
    self._last_obs = res.value[0]
    return res.value[0], dict(res.value[1])

  def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    handle = self._ensure_handle() if self._handle is None else self._handle
    res = self._pool.step_many([handle], [action])[0]
    if not res.ok:
      self._last_obs = ""
      return "", 0.0, True, False, self._error_info(res.reason, res.detail)
    obs, reward, terminated, truncated, info = res.value
    self._last_obs = obs
    return obs, float(reward), bool(terminated), bool(truncated), dict(info)

  def hint(self) -> str | None:
    """The program's hint() for the current episode, or None."""
    if self._handle is None or not self._handle.alive:
      return None
    res = self._pool.call_many([self._handle], "hint")[0]
    return res.value if res.ok else None

  def solution(self) -> list[str] | None:
    """The program's solution() for the current episode, or None."""
    if self._handle is None or not self._handle.alive:
      return None
    res = self._pool.call_many([self._handle], "solution")[0]
    return res.value if res.ok else None

  def render(self) -> str | None:
    if self.render_mode == "ansi":
      return self._last_obs
    return None

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    if self._handle is not None:
      self._pool.release([self._handle])
      self._handle = None
    if self._owns_pool:
      self._pool.close()


def register() -> None:
  """Registers :data:`ENV_ID` with gymnasium (idempotent)."""
  if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=ProgramEnv, disable_env_checker=False)


register()
