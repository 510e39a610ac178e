"""Experience storage (on-policy rollouts, replay buffers) and the samplers that draw minibatches from it."""

from shoal.buffers.prioritized import PrioritizedReplayBuffer
from shoal.buffers.replay import ReplayBuffer
from shoal.buffers.rollout import RolloutBuffer, env_fields, torch_dtype, transition_view
from shoal.buffers.samplers import FlatSampler, SegmentSampler, num_minibatches
from shoal.buffers.sequence import PrioritizedSequenceReplayBuffer, SequenceReplayBuffer

__all__ = [
    "FlatSampler",
    "PrioritizedReplayBuffer",
    "PrioritizedSequenceReplayBuffer",
    "ReplayBuffer",
    "RolloutBuffer",
    "SegmentSampler",
    "SequenceReplayBuffer",
    "env_fields",
    "num_minibatches",
    "torch_dtype",
    "transition_view",
]
