"""Action distributions as plain functions of the network's output.

No torch.distributions objects: building one per forward costs more than the math itself at
rollout batch sizes. Each class is stateless and works on batches of flat parameters.

``log_prob_entropy`` also returns what its hand-written ``backward`` needs, so the learn step can
run without the autograd engine (``ActorCritic.evaluate_backward``); tests/test_models.py checks
each backward against autograd.
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
        """Log-probability of ``action``, entropy (None unless asked for), and the backward's context."""
        logp = logits.log_softmax(-1)
        ent = -(logp.exp() * logp).sum(-1) if entropy else None
        index = action.unsqueeze(-1)
        return logp.gather(-1, index).squeeze(-1), ent, (logp, index, ent)

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> torch.Tensor:
        """Gradient wrt the logits. With p = softmax, l = log p, H = -sum p l:
        d l_a / dz = onehot(a) - p  and  dH / dz = -p (l + H)."""
        logp, index, ent = ctx
        coef = grad_logp.unsqueeze(-1)
        if grad_entropy is not None:
            coef = coef + grad_entropy.unsqueeze(-1) * (logp + ent.unsqueeze(-1))
        grad = logp.exp().mul_(coef).neg_()
        return grad.scatter_add_(-1, index, grad_logp.unsqueeze(-1))


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
        parts = [p.log_prob_entropy(x, a, entropy) for p, x, a in zip(self.parts, logits.split(self.nvec, -1), action.unbind(-1))]
        ent = sum(e for _, e, _ in parts) if entropy else None
        return sum(lp for lp, _, _ in parts), ent, [c for _, _, c in parts]

    def backward(self, ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> torch.Tensor:
        # log-probability and entropy are sums over the parts: each part gets the same gradients
        return torch.cat([p.backward(c, grad_logp, grad_entropy) for p, c in zip(self.parts, ctx)], -1)


class DiagGaussian:
    """A Box action from ``mean [B, d]`` and a state-independent ``log_std [d]``."""

    def __init__(self, dim: int):
        self.param_dim = dim

    @staticmethod
    def _log_density(z: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """log N(a; mean, std) summed over dims, from the standardized action z = (a - mean) / std."""
        return -(0.5 * z.square() + log_std + _LOG_SQRT_2PI).sum(-1)

    def sample(self, mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False):
        noise = torch.zeros_like(mean) if deterministic else torch.randn_like(mean)
        return mean + noise * log_std.exp(), self._log_density(noise, log_std)

    def entropy(self, log_std: torch.Tensor, batch: int) -> torch.Tensor:
        return (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1).expand(batch)

    def log_prob_entropy(self, mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor, entropy: bool = True):
        """Log-probability of ``action``, entropy (None unless asked for), and the backward's context."""
        inv_std = (-log_std).exp()
        z = (action - mean) * inv_std
        return self._log_density(z, log_std), self.entropy(log_std, mean.shape[0]) if entropy else None, (z, inv_std)

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients wrt the mean and log_std. With z = (a - mean) / std:
        d logp / d mean = z / std,  d logp / d log_std = z^2 - 1,  d H / d log_std = 1."""
        z, inv_std = ctx
        g = grad_logp.unsqueeze(-1)
        grad_log_std = (g * (z.square() - 1.0)).sum(0)
        if grad_entropy is not None:
            grad_log_std += grad_entropy.sum()
        return g * z * inv_std, grad_log_std
