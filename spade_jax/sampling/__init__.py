"""KV-cache sampling: prefill + decode loop, sampling rules, multi-turn continuation."""

from spade_jax.sampling.engine import DecodeState, Engine, bucket, num_engine_programs
from spade_jax.sampling.rules import (Greedy, MinP, SamplingConfig, Temperature, TopK,
                                      TopP, draw, row_keys, sample_logits)
from spade_jax.sampling.sampler import (Generation, Sampler, generate,
                                        num_compiled_programs)
from spade_jax.sampling.batching import (Completion, Output, Request, Turn, check_requests,
                                         schedule, serve)
