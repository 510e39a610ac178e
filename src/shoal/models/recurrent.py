"""Recurrent actor-critics: ``encoder -> LSTM or GRU core -> policy and value heads``.

``model_config={"core": "lstm", "core_size": 128}`` puts a recurrent core behind any encoder (the
MLP over flat observations, the CNN, one encoder per key of a Dict). The core's state is one
TensorDict row per agent (``h``, and ``c`` for an LSTM), carried by the collector from step to step
and zeroed where an episode starts.

Acting runs the core one step at a time; learning replays each ``[segments, bptt_horizon]``
segment from the state stored at its start, zeroing it again at every episode start inside the
segment, so a training forward with unchanged weights reproduces what the rollout computed. Both
use the same cell (``nn.LSTMCell`` / ``nn.GRUCell``), one step per time step.
"""

from __future__ import annotations

from typing import Literal

import torch
from tensordict import TensorDict
from torch import nn

from shoal.envs.spaces import ActionSpec
from shoal.models.layers import linear_head
from shoal.models.networks import POLICY_GAIN, VALUE_GAIN
from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import ActorCriticPolicy

Core = Literal["lstm", "gru"]


class RecurrentModel(nn.Module):
    """``trunk`` (observations ``[B, ...]`` to features ``[B, feature_dim]``) feeding a recurrent
    core of ``size`` units, whose output feeds both heads."""

    def __init__(self, trunk: nn.Module, feature_dim: int, num_outputs: int, core: Core, size: int):
        super().__init__()
        self.trunk = trunk
        self.core, self.size = core, size
        self.cell: nn.LSTMCell | nn.GRUCell = (
            nn.LSTMCell(feature_dim, size) if core == "lstm" else nn.GRUCell(feature_dim, size)
        )
        for name, param in self.cell.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param)
            else:
                nn.init.zeros_(param)
        self.state_keys = ("h", "c") if core == "lstm" else ("h",)
        self.policy_head = linear_head(size, num_outputs, POLICY_GAIN)
        self.value_head = linear_head(size, 1, VALUE_GAIN)

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> TensorDict:
        """Zeros: the state of ``rows`` agent rows at an episode start."""
        return TensorDict(
            {key: torch.zeros(rows, self.size, device=device) for key in self.state_keys},
            batch_size=[rows],
            device=device,
        )

    def cell_step(self, features: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """One step of the core: the new state (its first tensor is the output)."""
        if isinstance(self.cell, nn.LSTMCell):
            h, c = self.cell(features, (state[0], state[1]))
            return h, c
        return (self.cell(features, state[0]),)

    def heads(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy_head(out), self.value_head(out).squeeze(-1)

    def forward(
        self, obs: torch.Tensor, state: TensorDict, first: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """One step for a batch of rows: distribution inputs ``[B, P]``, values ``[B]`` and the next
        state (as a tuple in ``state_keys`` order). Rows where ``first`` is True start from zeros."""
        prev = tuple(state[key] for key in self.state_keys)
        if first is not None:
            reset = first.unsqueeze(1)
            prev = tuple(x.masked_fill(reset, 0.0) for x in prev)
        nxt = self.cell_step(self.trunk(obs), prev)
        return (*self.heads(nxt[0]), nxt)

    def forward_sequence(
        self, obs: torch.Tensor, start_state: TensorDict, first: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Segments ``obs [S, L, ...]`` replayed from ``start_state [S]``, zeroing the state where
        ``first [S, L]`` is True: distribution inputs ``[S, L, P]`` and values ``[S, L]``."""
        segments, length = first.shape
        features = self.trunk(obs.flatten(0, 1)).unflatten(0, (segments, length))  # the encoder at once
        state = tuple(start_state[key] for key in self.state_keys)
        resets = first.unsqueeze(2).unbind(1)
        outputs = []
        for t, x in enumerate(features.unbind(1)):
            state = self.cell_step(x, tuple(s.masked_fill(resets[t], 0.0) for s in state))
            outputs.append(state[0])
        return self.heads(torch.stack(outputs, dim=1))


class RecurrentActorCriticPolicy(ActorCriticPolicy):
    """An actor-critic with a recurrent core: ``act`` carries each row's state, ``evaluate_segments``
    replays stored segments for learning (see the module docstring)."""

    model: RecurrentModel

    def __init__(
        self,
        model: RecurrentModel,
        action: ActionSpec,
        obs_normalizer: ObsNormalizer | None = None,
        log_std_init: float = 0.0,
    ):
        super().__init__(model, action, obs_normalizer, None, log_std_init)

    def initial_state(self, rows: int) -> TensorDict:
        return self.model.initial_state(rows, self.model.policy_head.weight.device)

    def act(
        self,
        obs: torch.Tensor,
        state: TensorDict,
        first: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        deterministic: bool = False,
        out: TensorDict | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TensorDict, TensorDict]:
        """Like ``ActorCriticPolicy.act``, one step of the core from ``state`` (zeros where
        ``first``); returns the next state as a new TensorDict (``state`` is left as it was)."""
        obs, _ = self.normalize(obs)
        params, value, nxt = self.model(obs, state, first)
        action, logp = self.sample(params, action_mask, deterministic)
        next_state = TensorDict(dict(zip(self.model.state_keys, nxt)), batch_size=state.batch_size)
        return action, self.write_extras(logp, value, out), next_state

    def value(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """Values ``[B]`` of raw observations seen from ``state`` (the state the rows had when they
        saw them; zeros when None)."""
        obs, _ = self.normalize(obs)
        if state is None:
            state = self.initial_state(obs.shape[0])
        step: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]] = self.model(obs, state)
        return step[1]

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values of observations as episode starts (from zeros); learning
        and acting go through ``evaluate_segments`` and ``act``, which carry the state."""
        step: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]] = self.model(
            self.normalize(obs)[0], self.initial_state(obs.shape[0])
        )
        return step[0], step[1]

    def evaluate_segments(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        first: torch.Tensor,
        start_state: TensorDict,
        entropy: bool = True,
        action_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``evaluate`` over segments ``[S, L]``: log-probabilities, entropies (None when not
        asked for) and values, each ``[S, L]``, replayed from each segment's ``start_state``."""
        obs, _ = self.normalize(obs)
        params, value = self.model.forward_sequence(obs, start_state, first)
        flat_mask = None if action_mask is None else action_mask.flatten(0, 1)
        logp, ent = self.score(params.flatten(0, 1), action.flatten(0, 1), entropy, flat_mask)
        shape = first.shape
        return logp.view(shape), None if ent is None else ent.view(shape), value
