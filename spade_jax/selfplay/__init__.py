"""Self-play: episodes, the regret stage (buffer -> rewards), the iteration, the run.

Data path of one iteration (``SelfPlay.iteration``): designer prompts -> sampler ->
validation in the sandbox -> agent episodes (``episodes``) -> :class:`RegretBuffer`
(``buffer``) -> designer rewards and agent advantages (``rewards``) -> packed GRPO
batch (``batch``) -> train step. The baselines (``baselines``: a static pool; ``rlve``:
reasoning-gym tasks under a difficulty controller) replace the first two stages with a
draw from an env source. ``build`` turns a config into the parts; ``loop`` drives
iterations, held-out evaluation, checkpoints and metrics.

The iteration is a sequence of stage rooms (``stages``: design, hints, play, credit,
train) over an explicit state; below them lie ``config`` (:class:`SelfPlayConfig`),
``state`` (:class:`Slot`, :class:`DesignSample`, :class:`HostState` and their checkpoint
JSON) and ``roles`` (role -> sampler, keys and chat).
"""

from spade_jax.selfplay.baselines import (ENV_SOURCES, EnvSource, RLVESource, StaticPool,
                                          StaticPoolConfig, make_env_source)
from spade_jax.selfplay.batch import Row, build_batches
from spade_jax.selfplay.buffer import RegretBuffer
from spade_jax.selfplay.build import Run, RunConfig, build_run, load_vocab, make, resolve, summary
from spade_jax.selfplay.config import SelfPlayConfig
from spade_jax.selfplay.episodes import (Episode, EpisodeSpec, run_episodes,
                                        run_episodes_with_requests)
from spade_jax.selfplay.iteration import SelfPlay
from spade_jax.selfplay.loop import (eval_due, evaluate_params, evaluate_policy, progress_line,
                                    train)
from spade_jax.selfplay.rewards import (VARIANTS, EnvStats, RewardConfig, RewardOutput,
                                        compute_rewards, credit, plateau, reference_scale)
from spade_jax.selfplay.rlve import DifficultyController, RLVEConfig
from spade_jax.selfplay.roles import RoleSampling
from spade_jax.selfplay.state import DesignSample, HostState, Slot
