"""Experience storage."""

from shoal.buffers.rollout import RolloutBuffer, iterate_minibatches, torch_dtype, transition_view

__all__ = ["RolloutBuffer", "iterate_minibatches", "torch_dtype", "transition_view"]
