"""Qwen3-shaped decoder models, presets and vocabularies."""

from spade_jax.models.config import ModelConfig, PRESETS, get_preset
from spade_jax.models.qwen3 import (forward, init_cache, init_params,
                                    logits_from_hidden, param_axes,
                                    param_shapes, segment_mask, token_logprobs)
from spade_jax.models.vocab import ByteVocab
from spade_jax.models.chat import ChatTemplate
