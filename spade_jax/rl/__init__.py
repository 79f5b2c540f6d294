"""GRPO: loss family, advantages, optimizer and the sharded train step."""

from spade_jax.rl.advantages import compute_advantages, get_advantage_fn
from spade_jax.rl.loss import (LossConfig, combine_metric_sums, finalize_loss,
                               finalize_metrics, grpo_loss, grpo_loss_terms)
from spade_jax.rl.optimizer import OptimizerConfig, make_optimizer
from spade_jax.rl.train_step import (BATCH_FIELDS, ROLES, TrainConfig, Trainer,
                                     TrainState)
