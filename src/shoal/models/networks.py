"""The built-in actor-critic networks: ``obs -> (action distribution inputs [B, P], value [B])``.

``MLPModel`` is the default: separate actor and critic MLPs run side by side as one batched
matmul per layer (``StackedMLP``), optionally with a centralized critic input. ``EncoderModel``
puts an observation encoder (CNN for images, one encoder per key for Dict/Tuple observations, or
a flatten) under the MLP, with one trunk shared by both heads or a copy for each.
A user's own module follows the same contract (see ``shoal.models.catalog``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from shoal.models.encoders import Encoder
from shoal.models.layers import StackedMLP, linear_head, mlp

POLICY_GAIN, VALUE_GAIN = 0.01, 1.0  # small policy-head init: near-uniform actions at the start


class MLPModel(StackedMLP):
    """Separate actor and critic MLPs over the flattened observation, as two stacked towers.

    With ``critic_dim`` the critic is centralized (MAPPO): it sees ``critic_obs`` ``[B,
    critic_dim]`` (e.g. the whole team's observations) while the actor sees only ``obs``; both
    inputs are zero-padded to one width so the towers still run as one batched matmul. Without
    ``critic_obs`` such a critic sees zeros, which is fine where only actions are wanted.
    """

    def __init__(
        self, obs_dim: int, num_outputs: int, hiddens: list[int], activation: str = "tanh", critic_dim: int = 0
    ):
        super().__init__(max(obs_dim, critic_dim), hiddens, [num_outputs, 1], [POLICY_GAIN, VALUE_GAIN], activation)
        self.obs_dim, self.critic_dim = obs_dim, critic_dim

    def inputs(self, obs: torch.Tensor, critic_obs: torch.Tensor | None) -> torch.Tensor:
        """The towers' input: ``[B, obs_dim]``, or ``[2, B, width]`` with a centralized critic."""
        x = obs.flatten(1)
        dtype = self.flat_params[0].dtype
        if x.dtype != dtype:
            x = x.to(dtype)
        if not self.critic_dim:
            return x
        both = x.new_zeros(2, x.shape[0], max(self.obs_dim, self.critic_dim))
        both[0, :, : self.obs_dim] = x
        if critic_obs is not None:
            both[1, :, : self.critic_dim] = critic_obs
        return both

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        params, value = super().forward(self.inputs(obs, critic_obs))
        return params, value.squeeze(-1)

    def forward_features(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward``'s outputs and the actor's last hidden layer ``[B, h]`` (gSDE's features)."""
        (params, value), hidden = self.forward_hidden(self.inputs(obs, critic_obs))
        return params, value.squeeze(-1), hidden[0]


class EncoderModel(nn.Module):
    """``encoder -> MLP -> heads``. ``shared``: one encoder and trunk feed both heads (the usual
    choice for pixels, where the encoder is most of the compute); otherwise actor and critic each
    get their own copy. ``layer_norm`` normalizes each hidden layer before its activation."""

    def __init__(
        self,
        make_encoder: Callable[[], Encoder],
        num_outputs: int,
        hiddens: list[int],
        activation: str,
        shared: bool,
        layer_norm: bool = False,
    ):
        super().__init__()
        self.shared = shared

        def trunk() -> nn.Sequential:
            encoder = make_encoder()
            return nn.Sequential(encoder, mlp(encoder.out_dim, hiddens, activation, layer_norm))

        self.actor = trunk()
        self.critic = None if shared else trunk()
        self.policy_head = linear_head(hiddens[-1], num_outputs, POLICY_GAIN)
        self.value_head = linear_head(hiddens[-1], 1, VALUE_GAIN)

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        policy, value, _ = self.forward_features(obs)
        return policy, value

    def forward_features(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward``'s outputs and the actor trunk's output ``[B, h]`` (gSDE's features)."""
        features = self.actor(obs)
        value_features = features if self.critic is None else self.critic(obs)
        return self.policy_head(features), self.value_head(value_features).squeeze(-1), features
