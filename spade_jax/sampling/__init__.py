"""KV-cache sampling: prefill + decode loop, sampling rules, log-probs."""

from spade_jax.sampling.sampler import (Generation, SamplingConfig, bucket,
                                        generate, num_compiled_programs,
                                        sample_logits)
