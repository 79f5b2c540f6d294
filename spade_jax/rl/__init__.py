"""GRPO and SFT: loss family, advantages, optimizer and the sharded train step."""

from spade_jax.rl.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from spade_jax.rl.logprobs import chunked_head_logprobs, chunked_token_logprobs
from spade_jax.rl.loss import (LossConfig, Sequences, combine_metric_sums,
                               finalize_loss, finalize_metrics, grpo_loss,
                               grpo_loss_terms, sequence_denominator, sequences,
                               tis_weight)
from spade_jax.rl.optimizer import OptimizerConfig, make_optimizer
from spade_jax.rl.sft import (finalize_sft_metrics, sft_loss, sft_loss_terms,
                              trained_tokens)
from spade_jax.rl.objectives import (OBJECTIVES, OLD_LOGPS, ROLES, Objective,
                                     batch_loss_terms, finalize_train_metrics,
                                     sft_batch_terms)
from spade_jax.rl.train_step import (BATCH_FIELDS, PER_ROW_FIELDS, TrainConfig, Trainer,
                                     TrainState)
