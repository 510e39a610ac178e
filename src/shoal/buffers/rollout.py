"""On-policy rollout storage (seed 002): one preallocated TensorDict of batch shape ``[N, T+1]``.

``N`` agent rows by ``T`` steps. Slot ``T`` holds the last observation and its value (the
bootstrap); for transition-only fields (action, reward, flags...) it is padding, so every field
shares one batch shape. ``transition_view`` and ``iterate_minibatches`` are the only slicing code.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from tensordict import TensorDict


class RolloutBuffer:
    def __init__(self, num_rows: int, horizon: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype,
                 action_shape: tuple[int, ...], action_dtype: torch.dtype, device: str | torch.device = "cpu",
                 mask_size: int = 0, critic_dim: int = 0):
        self.num_rows, self.horizon = num_rows, horizon
        n, t1 = num_rows, horizon + 1
        f32 = dict(dtype=torch.float32, device=device)
        flag = dict(dtype=torch.bool, device=device)
        self.rollout = TensorDict(
            {
                "obs": torch.zeros(n, t1, *obs_shape, dtype=obs_dtype, device=device),
                "action": torch.zeros(n, t1, *action_shape, dtype=action_dtype, device=device),
                "sample_log_prob": torch.zeros(n, t1, **f32),
                "value": torch.zeros(n, t1, **f32),
                "final_value": torch.zeros(n, t1, **f32),  # value of the true last obs, at truncated steps
                "reward": torch.zeros(n, t1, **f32),
                "done": torch.zeros(n, t1, **flag),
                "terminated": torch.zeros(n, t1, **flag),
                "truncated": torch.zeros(n, t1, **flag),
                "valid": torch.ones(n, t1, **flag),  # False: padding or a next-step reset, masked from losses
                "policy_id": torch.zeros(n, t1, dtype=torch.long, device=device),  # which policy acted
                "advantage": torch.zeros(n, t1, **f32),
                "return": torch.zeros(n, t1, **f32),
            },
            batch_size=[n, t1],
            device=device,
        )
        if mask_size:  # the legal actions at each step, so the learner scores the same masked distribution
            self.rollout["action_mask"] = torch.ones(n, t1, mask_size, **flag)
        if critic_dim:  # what a centralized critic sees at each step
            self.rollout["critic_obs"] = torch.zeros(n, t1, critic_dim, **f32)
        self._full = False

    def start_rollout(self) -> TensorDict:
        """The shared storage for the collector to write into."""
        self._full = False
        return self.rollout

    def add(self, rollout: TensorDict) -> None:
        """Mark the shared rollout as ready for the learner."""
        if rollout is not self.rollout:
            raise ValueError("RolloutBuffer.add expects the TensorDict returned by start_rollout()")
        self._full = True

    def get(self, flatten: bool = True) -> TensorDict:
        """The stored rollout as a transition view over the first ``T`` steps."""
        if not self._full:
            raise RuntimeError("RolloutBuffer.get() called before a rollout was added")
        return transition_view(self.rollout, flatten=flatten)


def transition_view(rollout: TensorDict, flatten: bool = False) -> TensorDict:
    """Drop the padded last slot: ``[N, T+1] -> [N, T]``, or ``[N*T]`` with ``flatten``."""
    view = rollout[:, :-1]
    return view.reshape(-1) if flatten else view


def iterate_minibatches(data: TensorDict, batch_size: int, generator: torch.Generator | None = None,
                        device: str | torch.device | None = None) -> Iterator[TensorDict]:
    """Shuffled minibatches of ``batch_size`` over the leading dim of a flat ``data``.

    When ``batch_size`` does not divide the data (a policy's share of a multi-policy batch varies
    with the mapping), it is split into the nearest number of near-equal minibatches instead.
    A single minibatch covering all of ``data`` is yielded as-is: the loss is a mean, so its
    order does not matter and the gather would be wasted work.
    """
    total = data.batch_size[0]
    count = num_minibatches(total, batch_size)
    if count == 1:
        yield data if device is None else data.to(device)
        return
    perm = torch.randperm(total, generator=generator, device=data.device)
    for index in perm.tensor_split(count):
        mb = data[index]
        yield mb if device is None else mb.to(device)


def num_minibatches(total: int, batch_size: int) -> int:
    """How many minibatches ``iterate_minibatches`` makes of ``total`` transitions."""
    return max(1, round(total / batch_size))


def torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype
