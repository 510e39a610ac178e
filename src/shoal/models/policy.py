"""The actor-critic every on-policy algorithm in shoal uses by default."""

from __future__ import annotations

import torch
from torch import nn

from shoal.envs.spaces import ActionSpec
from shoal.models.distributions import Categorical, DiagGaussian, MultiCategorical
from shoal.models.layers import StackedMLP

# raised rather than ignoring the mask: a caller passing one expects it to constrain the actions
BOX_MASK_ERROR = "action_mask is only supported for Discrete and MultiDiscrete actions, not continuous (Box)"


def make_distribution(spec: ActionSpec):
    if spec.kind == "discrete":
        return Categorical(spec.nvec[0])
    if spec.kind == "multi_discrete":
        return MultiCategorical(spec.nvec)
    return DiagGaussian(spec.shape[0])


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (no shared trunk), computed side by side.

    With ``critic_dim`` the critic is centralized (MAPPO): it sees ``critic_obs`` ``[B,
    critic_dim]`` (e.g. the whole team's observations) while the actor sees only its own
    ``obs``; both inputs are zero-padded to one width so the towers still run as one batched
    matmul. Every method takes ``critic_obs``; without it such a critic sees zeros, which is fine
    where only actions are wanted (evaluation, ``compute_actions``).

    ``act`` is the rollout path (sample, log-prob, value); ``evaluate`` the learning path
    (log-prob and entropy of stored actions, value). Each takes an optional ``action_mask`` for
    Discrete / MultiDiscrete actions, bool ``[B, sum(nvec)]``, True = allowed (see
    ``shoal.models.distributions``); the learning path must be given the mask the action was
    sampled under.
    """

    def __init__(self, obs_dim: int, action: ActionSpec, hiddens: list[int], activation: str = "tanh",
                 log_std_init: float = 0.0, critic_dim: int = 0):
        super().__init__()
        self.dist = make_distribution(action)
        self.continuous = action.kind == "continuous"
        self.obs_dim, self.critic_dim = obs_dim, critic_dim
        self.net = StackedMLP(max(obs_dim, critic_dim), hiddens, [self.dist.param_dim, 1], head_gains=[0.01, 1.0],
                              activation=activation)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((self.dist.param_dim,), float(log_std_init)))

    def _inputs(self, obs: torch.Tensor, critic_obs: torch.Tensor | None) -> torch.Tensor:
        """The network input: ``[B, obs_dim]``, or ``[2, B, width]`` with a centralized critic."""
        x = obs.reshape(obs.shape[0], -1).float()
        if not self.critic_dim:
            return x
        both = x.new_zeros(2, x.shape[0], max(self.obs_dim, self.critic_dim))
        both[0, :, :self.obs_dim] = x
        if critic_obs is not None:
            both[1, :, :self.critic_dim] = critic_obs
        return both

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters ``[B, param_dim]`` and values ``[B]``."""
        params, value = self.net(self._inputs(obs, critic_obs))
        return params, value.squeeze(-1)

    def value(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward(obs, critic_obs)[1]

    def act(self, obs: torch.Tensor, deterministic: bool = False, action_mask: torch.Tensor | None = None,
            critic_obs: torch.Tensor | None = None):
        """Sample actions: returns ``(action, log_prob, value)``."""
        params, value = self.forward(obs, critic_obs)
        if self.continuous:
            if action_mask is not None:
                raise ValueError(BOX_MASK_ERROR)
            action, logp = self.dist.sample(params, self.log_std, deterministic)
        else:
            action, logp = self.dist.sample(params, deterministic, action_mask)
        return action, logp, value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, entropy: bool = True,
                 action_mask: torch.Tensor | None = None, critic_obs: torch.Tensor | None = None):
        """Log-probability of ``action`` under the current policy, its entropy (None when not asked
        for) and values."""
        params, value = self.forward(obs, critic_obs)
        return *self._log_prob_entropy(params, action, entropy, action_mask)[:2], value

    @torch.no_grad()
    def evaluate_backward(self, obs: torch.Tensor, action: torch.Tensor, loss_and_grad, entropy: bool = True,
                          action_mask: torch.Tensor | None = None, critic_obs: torch.Tensor | None = None):
        """``evaluate`` and the backward pass of a loss of its outputs, without the autograd engine.

        ``loss_and_grad(logp, entropy, value)`` returns ``(result, (grad_logp, grad_value,
        grad_entropy))``; the gradient is written (not accumulated) into every parameter's
        ``.grad``, which must exist (see ``flatten_parameters``). Returns ``result`` and the entropy.
        The engine's graph bookkeeping costs more than the arithmetic on networks this small.
        """
        x = self._inputs(obs, critic_obs)
        (params, value), hidden = self.net.forward_for_backward(x)
        logp, ent, ctx = self._log_prob_entropy(params, action, entropy, action_mask)
        result, (grad_logp, grad_value, grad_entropy) = loss_and_grad(logp, ent, value.squeeze(-1))
        if self.continuous:
            grad_params, grad_log_std = self.dist.backward(ctx, grad_logp, grad_entropy)
            self.log_std.grad.copy_(grad_log_std)
        else:
            grad_params = self.dist.backward(ctx, grad_logp, grad_entropy)
        self.net.backward_into_grad(x, hidden, (grad_params, grad_value.unsqueeze(-1)))
        return result, ent

    def _log_prob_entropy(self, params: torch.Tensor, action: torch.Tensor, entropy: bool,
                          action_mask: torch.Tensor | None):
        if self.continuous:
            if action_mask is not None:
                raise ValueError(BOX_MASK_ERROR)
            return self.dist.log_prob_entropy(params, self.log_std, action, entropy)
        return self.dist.log_prob_entropy(params, action, entropy, action_mask)
