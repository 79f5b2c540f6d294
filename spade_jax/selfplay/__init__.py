"""Self-play: episode runner, regret buffer, the iteration and the training run."""

from spade_jax.selfplay.batch import Row, build_batch
from spade_jax.selfplay.episodes import Episode, EpisodeSpec, run_episodes
from spade_jax.selfplay.iteration import SelfPlay, SelfPlayConfig, Slot
from spade_jax.selfplay.loop import progress_line, train
