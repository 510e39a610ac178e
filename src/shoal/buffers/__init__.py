"""Experience storage and the samplers that draw minibatches from it."""

from shoal.buffers.rollout import RolloutBuffer, env_fields, torch_dtype, transition_view
from shoal.buffers.samplers import FlatSampler, SegmentSampler, num_minibatches

__all__ = [
    "FlatSampler",
    "RolloutBuffer",
    "SegmentSampler",
    "env_fields",
    "num_minibatches",
    "torch_dtype",
    "transition_view",
]
