"""Qwen3 / Qwen3-MoE / Llama decoder models, presets, HF and GGUF interop, vocabularies."""

from spade_jax.models.config import ModelConfig, PRESETS, get_preset, preset_key
from spade_jax.models.attention import ATTENTION, DECODE_ATTENTION, DECODE_BLOCK
from spade_jax.models.cache import (KEY_CACHE_AXES, VALUE_CACHE_AXES, cache_shapes, init_cache,
                                    write_cache)
from spade_jax.models.moe import load_balancing_loss
from spade_jax.models.qwen3 import (Params, forward, init_params, layer_segments,
                                    logits_from_hidden, num_params, param_axes,
                                    param_shapes, segment_mask, token_logprobs)
from spade_jax.models.decode import decode_params, decode_step
from spade_jax.models.vocab import ByteVocab
from spade_jax.models.chat import ChatTemplate
from spade_jax.models.hf import (config_from_hf, config_to_hf, copy_tokenizer_files,
                                 hf_model_type, load_hf, read_hf_config, save_hf)
from spade_jax.models.chat import render_chat
from spade_jax.models.checkpoint_io import (load_checkpoint, load_model, load_model_config,
                                            resolve_checkpoint, save_model)
from spade_jax.models.gguf import cached_conversion, convert_gguf, preset_checkpoint
from spade_jax.models.tokenizer import HFTokenizer, load_tokenizer
