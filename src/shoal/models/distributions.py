"""Action distributions as plain functions of the network's output.

No torch.distributions objects: building one per forward costs more than the math itself at
rollout batch sizes. Each class is stateless and works on batches of flat parameters.

``log_prob_entropy`` also returns what its hand-written ``backward`` needs, so the learn step can
run without the autograd engine (``ActorCritic.evaluate_backward``); tests/test_models.py checks
each backward against autograd.

Action masks (Discrete and MultiDiscrete): ``mask`` is a bool tensor shaped like the logits,
True = allowed; a MultiDiscrete mask is the sub-actions' masks concatenated (the
PettingZoo/Gymnasium convention). Disallowed logits are replaced by -sqrt(finfo.max), -1.8e19 in
float32: their probability is exactly 0, so every 0 * log p term is 0. Not -inf (0 * -inf is
NaN) and not finfo.min either: the entropy's backward multiplies log p by its gradient, which
overflows to inf (then 0 * inf = NaN, in autograd too) once that gradient exceeds 1.
A row (or a MultiDiscrete segment) with no allowed action is treated as unmasked: such rows are
padding (dead agents, excluded from the loss by ``valid``) and must stay finite; on a valid row
it is the caller's bug, and it is not checked for (that would cost a sync per call).
``mask=None`` runs exactly the unmasked code.
"""

from __future__ import annotations

import math

import torch

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _check_mask(mask: torch.Tensor, logits: torch.Tensor, expected: str) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be a bool tensor (True = allowed), got dtype {mask.dtype}")
    if mask.shape != logits.shape:
        raise ValueError(f"action_mask has shape {tuple(mask.shape)}, expected {tuple(logits.shape)} "
                         f"({expected})")


def _masked_logits(logits: torch.Tensor, mask: torch.Tensor | None, expected: str) -> torch.Tensor:
    """``logits`` with the disallowed entries filled (see the module docstring); a row with no
    allowed action (padding) is left as it is."""
    if mask is None:
        return logits
    _check_mask(mask, logits, expected)
    blocked = ~mask & mask.any(-1, keepdim=True)
    return logits.masked_fill(blocked, -math.sqrt(torch.finfo(logits.dtype).max))


class Categorical:
    """One Discrete action from ``logits [B, n]``."""

    def __init__(self, n: int):
        self.param_dim = n

    def sample(self, logits: torch.Tensor, deterministic: bool = False,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _masked_logits(logits, mask, f"[batch, {self.param_dim}]")
        logp = logits.log_softmax(-1)
        if deterministic:
            action = logp.argmax(-1, keepdim=True)
        else:
            # Gumbel-max: argmax(logp + G) with G = -log(Exp(1)) is an exact sample, and half the
            # cost of torch.multinomial at rollout batch sizes. exponential_ never returns 0 (torch
            # >= 2.1), so G stays below ~104 and a masked logp near -1.8e19 can never win.
            action = (logp - torch.empty_like(logp).exponential_().log_()).argmax(-1, keepdim=True)
        return action.squeeze(-1), logp.gather(-1, action).squeeze(-1)

    def log_prob_entropy(self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True,
                         mask: torch.Tensor | None = None):
        """Log-probability of ``action``, entropy (None unless asked for), and the backward's context."""
        logits = _masked_logits(logits, mask, f"[batch, {self.param_dim}]")
        logp = logits.log_softmax(-1)
        ent = -(logp.exp() * logp).sum(-1) if entropy else None  # masked: p = 0 exactly, p * logp = 0
        index = action.unsqueeze(-1)
        return logp.gather(-1, index).squeeze(-1), ent, (logp, index, ent)

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> torch.Tensor:
        """Gradient wrt the logits. With p = softmax, l = log p, H = -sum p l:
        d l_a / dz = onehot(a) - p  and  dH / dz = -p (l + H). A masked logit has p = 0 exactly, so
        its gradient is 0 (its action is never the one taken)."""
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

    def sample(self, logits: torch.Tensor, deterministic: bool = False,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [p.sample(x, deterministic, m)
                 for p, x, m in zip(self.parts, logits.split(self.nvec, -1), self._split_mask(mask, logits))]
        return torch.stack([a for a, _ in pairs], -1), sum(lp for _, lp in pairs)

    def log_prob_entropy(self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True,
                         mask: torch.Tensor | None = None):
        parts = [p.log_prob_entropy(x, a, entropy, m)
                 for p, x, a, m in zip(self.parts, logits.split(self.nvec, -1), action.unbind(-1),
                                       self._split_mask(mask, logits))]
        ent = sum(e for _, e, _ in parts) if entropy else None
        return sum(lp for lp, _, _ in parts), ent, [c for _, _, c in parts]

    def backward(self, ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> torch.Tensor:
        # log-probability and entropy are sums over the parts: each part gets the same gradients
        return torch.cat([p.backward(c, grad_logp, grad_entropy) for p, c in zip(self.parts, ctx)], -1)

    def _split_mask(self, mask: torch.Tensor | None, logits: torch.Tensor):
        """One mask per sub-action (all None without a mask), checked whole so a wrong width is
        reported against sum(nvec) rather than as a bad split."""
        if mask is None:
            return [None] * len(self.parts)
        _check_mask(mask, logits, f"[batch, sum(nvec)] = [batch, {self.param_dim}] for nvec {self.nvec}")
        return mask.split(self.nvec, -1)


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
