"""Request sampling pipeline shared by the target (p) and the draft (q)."""

from vllm_specdec_plugin.sampling.histories import expand_histories
from vllm_specdec_plugin.sampling.pipeline import (SAMPLING_EPS, SamplingSpec, make_generator,
                                                   position_probs, target_probs)

__all__ = ["SAMPLING_EPS", "SamplingSpec", "expand_histories", "make_generator", "position_probs",
           "target_probs"]
