"""PPO's loss terms as pure functions (Schulman et al. 2017, arXiv:1707.06347).

``mask`` (bool ``[B]`` or None) drops padding rows from every mean.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def normalize_advantage(adv: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-8) -> torch.Tensor:
    """(adv - mean) / (std + eps) over the valid rows of a minibatch (PPO detail #7)."""
    if mask is None:
        return (adv - adv.mean()) / (adv.std() + eps)
    mean = masked_mean(adv, mask)
    var = masked_mean((adv - mean).square(), mask)
    return (adv - mean) / (var.sqrt() + eps)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_coef: float,
                      mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Negated clipped surrogate objective, and the probability ratio."""
    ratio = (logp - old_logp).exp()
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef))
    return masked_mean(loss, mask), ratio


def value_loss(value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, clip_coef: float | None,
               mask: torch.Tensor | None) -> torch.Tensor:
    """0.5 * squared error, optionally clipped around the rollout's values (PPO detail #9)."""
    err = (value - returns).square()
    if clip_coef is not None:
        clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        err = torch.maximum(err, (clipped - returns).square())
    return 0.5 * masked_mean(err, mask)


@torch.no_grad()
def policy_stats(ratio: torch.Tensor, clip_coef: float, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """approx_kl (the low-variance estimator (r - 1) - log r) and the fraction of clipped ratios."""
    approx_kl = masked_mean((ratio - 1.0) - ratio.log(), mask)
    clipfrac = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), mask)
    return approx_kl, clipfrac


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var[target - pred] / Var[target]; nan when the target is constant."""
    var = target.var()
    return float("nan") if var == 0 else float(1.0 - (target - pred).var() / var)
