"""Action distributions as plain functions of the network's output.

No torch.distributions objects: building one per forward costs more than the math itself at
rollout batch sizes. Each class is stateless and works on batches of flat parameters.
"""

from __future__ import annotations

import math

import torch

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Categorical:
    """One Discrete action from ``logits [B, n]``."""

    def __init__(self, n: int):
        self.param_dim = n

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        logp = logits.log_softmax(-1)
        if deterministic:
            action = logp.argmax(-1, keepdim=True)
        else:
            # Gumbel-max: argmax(logp + G) with G = -log(Exp(1)) is an exact sample, and half the
            # cost of torch.multinomial at rollout batch sizes.
            action = (logp - torch.empty_like(logp).exponential_().log_()).argmax(-1, keepdim=True)
        return action.squeeze(-1), logp.gather(-1, action).squeeze(-1)

    def log_prob_entropy(self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True):
        logp = logits.log_softmax(-1)
        ent = -(logp.exp() * logp).sum(-1) if entropy else None
        return logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), ent


class MultiCategorical:
    """Independent Discrete actions from concatenated logits ``[B, sum(nvec)]``."""

    def __init__(self, nvec: tuple[int, ...]):
        self.nvec = list(nvec)
        self.param_dim = sum(nvec)
        self.parts = [Categorical(n) for n in nvec]

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [p.sample(x, deterministic) for p, x in zip(self.parts, logits.split(self.nvec, -1))]
        return torch.stack([a for a, _ in pairs], -1), sum(lp for _, lp in pairs)

    def log_prob_entropy(self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True):
        pairs = [p.log_prob_entropy(x, a, entropy) for p, x, a in zip(self.parts, logits.split(self.nvec, -1), action.unbind(-1))]
        return sum(lp for lp, _ in pairs), sum(e for _, e in pairs) if entropy else None


class DiagGaussian:
    """A Box action from ``mean [B, d]`` and a state-independent ``log_std [d]``."""

    def __init__(self, dim: int):
        self.param_dim = dim

    def sample(self, mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False):
        if deterministic:
            return mean, self.log_prob(mean, log_std, mean)
        noise = torch.randn_like(mean)
        action = mean + noise * log_std.exp()
        logp = -(0.5 * noise.square() + log_std + _LOG_SQRT_2PI).sum(-1)
        return action, logp

    def log_prob(self, mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        z = (action - mean) * (-log_std).exp()
        return -(0.5 * z.square() + log_std + _LOG_SQRT_2PI).sum(-1)

    def entropy(self, log_std: torch.Tensor, batch: int) -> torch.Tensor:
        return (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1).expand(batch)
