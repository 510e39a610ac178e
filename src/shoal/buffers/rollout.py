"""On-policy rollout storage: one preallocated TensorDict of batch shape ``[N, T+1]``.

``N`` agent rows by ``T`` steps. Slot ``T`` holds the last observation and what the policy said
of it (the bootstrap value); for transition-only fields (action, reward, flags...) it is padding,
so every field shares one batch shape. The collector writes the env fields and the per-step
extras its algorithm declared; the algorithm adds its own fields (advantages, returns).
``transition_view`` and the samplers in ``shoal.buffers.samplers`` are the only slicing code.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from shoal.envs.spaces import EnvInfo

FieldSpec = tuple[tuple[int, ...], torch.dtype]  # per-row shape and dtype of a stored field


def torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


def env_fields(env: EnvInfo) -> dict[str, FieldSpec]:
    """What the collector writes for every algorithm: observations in their own dtype (uint8
    images stay uint8), actions, rewards, episode flags (which step ends an episode, which
    observation starts one), which policy acted, and the action mask, centralized-critic input,
    ``info_keys`` values and a turn-based env's game ends when there are any."""
    fields = {
        "obs": (env.obs_spec.shape, torch_dtype(env.obs_spec.dtype)),
        "action": (env.act_spec.shape, torch_dtype(env.act_spec.dtype)),
        "reward": ((), torch.float32),
        "done": ((), torch.bool),
        "terminated": ((), torch.bool),
        "truncated": ((), torch.bool),
        "first": ((), torch.bool),  # the observation starts an episode (recurrent state is reset there)
        "valid": ((), torch.bool),  # False: padding or a next-step reset, masked from every loss
        "policy_id": ((), torch.long),
    }
    if env.mask_size:  # the legal actions at each step, so the learner scores the same masked distribution
        fields["action_mask"] = ((env.mask_size,), torch.bool)
    if env.critic_dim:  # what a centralized critic sees at each step
        fields["critic_obs"] = ((env.critic_dim,), torch.float32)
    if env.info_size:  # the step infos' values of info_keys
        fields["info"] = ((env.info_size,), torch.float32)
    if env.turn_based:  # where each env's game ended: a waiting agent's flags cannot tell
        fields["env_done"] = ((), torch.bool)
    return fields


class RolloutBuffer:
    """``[N, T+1]`` storage of the env fields plus ``fields`` (the algorithm's extras and its own),
    and, for recurrent policies, each policy's state at the start of every segment."""

    def __init__(
        self,
        env: EnvInfo,
        horizon: int,
        fields: dict[str, FieldSpec],
        device: str | torch.device = "cpu",
        segment_length: int | None = None,
        initial_states: list[TensorDict] | None = None,
    ):
        """``initial_states``: each policy's ``initial_state(1)`` (empty for feedforward policies);
        a non-empty one is stored every ``segment_length`` steps of each row (which must divide
        ``horizon``)."""
        self.num_rows, self.horizon = env.num_rows, horizon
        n, t1 = env.num_rows, horizon + 1
        specs = env_fields(env) | fields
        self.rollout = TensorDict(
            {key: torch.zeros(n, t1, *shape, dtype=dtype, device=device) for key, (shape, dtype) in specs.items()},
            batch_size=[n, t1],
            device=device,
        )
        """The one preallocated TensorDict ``[N, T+1]``: slot T holds the last observation and the
        policy's outputs on it (the bootstrap value); for transition fields it is padding."""
        self.rollout["valid"].fill_(True)
        if env.mask_size:
            self.rollout["action_mask"].fill_(True)
        self.start_states: list[TensorDict] | None = None
        """Each policy's state ``[N, T / segment_length]`` at every segment start (None when no
        policy keeps state), written by the collector."""
        if initial_states and any(not s.is_empty() for s in initial_states):  # type: ignore[no-untyped-call]
            if segment_length is None or horizon % segment_length:
                raise ValueError(f"segment_length={segment_length} must divide the horizon {horizon}")
            k = horizon // segment_length
            self.start_states = [s.expand(n, k).clone().to(device) for s in initial_states]
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
