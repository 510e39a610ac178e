"""The actor-critic every on-policy algorithm in shoal uses by default."""

from __future__ import annotations

import torch
from torch import nn

from shoal.envs.spaces import ActionSpec
from shoal.models.distributions import Categorical, DiagGaussian, MultiCategorical
from shoal.models.layers import StackedMLP


def make_distribution(spec: ActionSpec):
    if spec.kind == "discrete":
        return Categorical(spec.nvec[0])
    if spec.kind == "multi_discrete":
        return MultiCategorical(spec.nvec)
    return DiagGaussian(spec.shape[0])


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (no shared trunk), computed side by side.

    ``act`` is the rollout path (sample, log-prob, value); ``evaluate`` the learning path
    (log-prob and entropy of stored actions, value).
    """

    def __init__(self, obs_dim: int, action: ActionSpec, hiddens: list[int], activation: str = "tanh",
                 log_std_init: float = 0.0):
        super().__init__()
        self.dist = make_distribution(action)
        self.continuous = action.kind == "continuous"
        self.net = StackedMLP(obs_dim, hiddens, [self.dist.param_dim, 1], head_gains=[0.01, 1.0],
                              activation=activation)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((self.dist.param_dim,), float(log_std_init)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters ``[B, param_dim]`` and values ``[B]``."""
        params, value = self.net(obs.reshape(obs.shape[0], -1).float())
        return params, value.squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.forward(obs)[1]

    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """Sample actions: returns ``(action, log_prob, value)``."""
        params, value = self.forward(obs)
        if self.continuous:
            action, logp = self.dist.sample(params, self.log_std, deterministic)
        else:
            action, logp = self.dist.sample(params, deterministic)
        return action, logp, value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, entropy: bool = True):
        """Log-probability of ``action`` under the current policy, its entropy (None when not asked
        for) and values."""
        params, value = self.forward(obs)
        if self.continuous:
            ent = self.dist.entropy(self.log_std, obs.shape[0]) if entropy else None
            return self.dist.log_prob(params, self.log_std, action), ent, value
        logp, ent = self.dist.log_prob_entropy(params, action, entropy)
        return logp, ent, value
