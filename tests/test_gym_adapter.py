"""gymnasium adapter over sandboxed env programs."""

import pathlib
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from spade_jax.envs import ENV_ID, ProgramEnv, UnicodeText, builtin_programs
from spade_jax.sandbox import EnvPool, SandboxConfig

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "programs"
SANDBOX = SandboxConfig(num_workers=1, call_timeout_s=1.0, self_test=False)


@pytest.fixture(scope="module")
def pool():
  with EnvPool(SANDBOX) as p:
    yield p


@pytest.mark.parametrize("name", sorted(builtin_programs()))
def test_check_env_passes_on_builtins(name, pool):
  env = gymnasium.make(ENV_ID, source=builtin_programs()[name], pool=pool)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    check_env(env.unwrapped)
  env.close()


def test_make_owns_its_pool_and_plays_solution():
  env = gymnasium.make(ENV_ID, source=builtin_programs()["running_total"],
                       sandbox_config=SANDBOX)
  obs, info = env.reset(seed=7)
  assert "Operation 1" in obs and info == {}
  assert isinstance(env.observation_space, UnicodeText)
  assert env.observation_space.contains(obs + "é→\n")
  base = env.unwrapped
  assert "running values" in base.hint()
  total = 0.0
  for value in base.solution():
    obs, reward, terminated, truncated, info = env.step(f"So it is \\boxed{{{value}}}")
    total += reward
  assert terminated and not truncated and total == 1.0
  pool = base._pool  # pylint: disable=protected-access
  env.close()
  env.close()
  assert pool.live_workers == 0


def test_reset_without_seed_is_reproducible(pool):
  env = ProgramEnv(builtin_programs()["guess_secret"], pool=pool)
  env.reset(seed=3)
  a = [env.unwrapped.solution() for _ in range(1)] + [env.reset()[0] and env.solution()]
  env.reset(seed=3)
  b = [env.solution()] + [env.reset()[0] and env.solution()]
  assert a == b
  env.close()


def test_sandbox_failure_ends_episode(pool):
  src = (FIXTURES / "hostile_infinite_loop.py").read_text()
  env = ProgramEnv(src, pool=pool)
  obs, _ = env.reset(seed=0)
  obs, reward, terminated, truncated, info = env.step("go")
  assert terminated and reward == 0.0 and info["sandbox_reason"] == "timeout"
  obs, info = env.reset(seed=0)  # a fresh worker
  assert obs == "ready"
  env.close()


def test_bad_arguments():
  with pytest.raises(ValueError, match="source"):
    ProgramEnv("")
  with pytest.raises(ValueError, match="render_mode"):
    ProgramEnv("class XEnv: pass", render_mode="human",
               sandbox_config=SandboxConfig(num_workers=0, self_test=False))
