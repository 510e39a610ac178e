"""PPO's loss (Schulman et al. 2017, arXiv:1707.06347) and its diagnostics, as plain autograd ops.

    L = mean_w[ max(-A r, -A clip(r, 1-c, 1+c)) ]                      clipped surrogate
      + vf_coef * 0.5 * mean_w[ max((V - R)^2, (V_clip - R)^2) ]       value, optionally clipped
      - ent_coef * mean_w[ H ]                                          entropy bonus
    r = exp(logp - logp_old),  V_clip = V_old + clip(V - V_old, -c_v, c_v)

``mean_w`` is the mean over valid rows (``mask``; None = all rows). ``ppo_loss`` is called by name:
a minibatch TensorDict, the current policy's outputs and the coefficients in, named terms out.
tests/test_losses.py checks the value and gradients against a per-element Python loop; the
hand-fused learn step (``shoal.algos.ppo_fused``) takes the same call, writes the same gradient
out and is tested against this.

GRPO takes the clipped surrogate alone (``clipped_surrogate``) and adds ``kl_coef`` times the k3
estimate of the KL divergence to a reference policy (``kl_k3``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, TypedDict

import torch
from tensordict import TensorDict

from shoal import distributed

if TYPE_CHECKING:
    from shoal.config import PPOConfig


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over the rows where ``mask`` is True (all rows when it is None)."""
    if mask is None:
        return x.mean()
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def advantage_stats(adv: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of the valid advantages (Bessel-corrected without a mask);
    with several data-parallel ranks, of every rank's share of the minibatch."""
    if distributed.world_size() > 1:
        return _advantage_stats_across_ranks(adv, mask)
    if mask is None:
        return adv.mean(), adv.std()
    mean = masked_mean(adv, mask)
    return mean, masked_mean((adv - mean).square(), mask).sqrt()


def _advantage_stats_across_ranks(adv: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``advantage_stats`` of the ranks' advantages together, from one all-reduce of their counts,
    sums and sums of squares (in float64, where the difference of squares keeps its digits). A
    mask on any rank (padding rows) makes every rank take the masked, population std."""
    x = adv.double() if mask is None else adv.double() * mask
    count = x.new_tensor(float(adv.numel())) if mask is None else mask.sum().double()
    masked = x.new_tensor(float(mask is not None))
    n, total, squares, any_masked = distributed.sum_(torch.stack([count, x.sum(), x.square().sum(), masked])).unbind()
    mean = total / n.clamp_min(1.0)
    var = (squares - n * mean.square()) / torch.where(any_masked > 0, n, n - 1).clamp_min(1.0)
    return mean.to(adv.dtype), var.clamp_min(0.0).sqrt().to(adv.dtype)


def normalize_advantage(
    adv: torch.Tensor,
    mask: torch.Tensor | None,
    eps: float = 1e-8,
    stats: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """(adv - mean) / (std + eps): over the valid rows of ``adv``, or with the given ``stats`` (e.g.
    of all the minibatches one accumulated optimizer step learns from)."""
    mean, std = advantage_stats(adv, mask) if stats is None else stats
    return (adv - mean) / (std + eps)


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor | None, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate policy loss ``mean_w[max(-A r, -A clip(r, 1-c, 1+c))]`` and the ratio
    ``r = exp(logp - old_logp)`` (PPO and GRPO)."""
    ratio = (logp - old_logp).exp()
    pg_loss = masked_mean(torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)), mask)
    return pg_loss, ratio


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``KL(pi || pi_ref)`` from the log-probabilities of sampled actions under both, with the
    unbiased low-variance estimator k3: ``mean_w[exp(ref - logp) - (ref - logp) - 1]`` (each term is
    non-negative; GRPO's penalty)."""
    log_ratio = ref_logp - logp
    return masked_mean(log_ratio.exp() - log_ratio - 1.0, mask)


class PPOCoefficients(TypedDict):
    """The weights ``ppo_loss`` (and the hand-fused step) take by name, from a policy's config."""

    clip_coef: float
    vf_clip_coef: float | None
    vf_coef: float
    ent_coef: float


def ppo_coefficients(config: PPOConfig) -> PPOCoefficients:
    return PPOCoefficients(
        clip_coef=config.clip_coef, vf_clip_coef=config.vf_clip_coef, vf_coef=config.vf_coef, ent_coef=config.ent_coef
    )


class PPOTerms(NamedTuple):
    """What ``ppo_loss`` computes: the loss to minimize and its detached parts."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    vf_loss: torch.Tensor
    ratio: torch.Tensor
    """``exp(log_prob - sample_log_prob)`` per row."""


def ppo_loss(
    batch: TensorDict,
    *,
    log_prob: torch.Tensor,
    value: torch.Tensor,
    entropy: torch.Tensor | None,
    mask: torch.Tensor | None,
    clip_coef: float,
    vf_clip_coef: float | None,
    vf_coef: float,
    ent_coef: float,
) -> PPOTerms:
    """PPO's loss on a minibatch ``batch`` (``sample_log_prob``, ``advantage``, ``value`` and
    ``return`` as collected and estimated; the advantage already normalized or weighted as the
    learner wants) given the current policy's ``log_prob``, ``value`` and ``entropy`` of the same
    steps (``entropy`` may be None when ``ent_coef`` is 0); ``mask``: the valid rows (None: all).
    """
    advantage, returns = batch["advantage"], batch["return"]
    policy_loss, ratio = clipped_surrogate(log_prob, batch["sample_log_prob"], advantage, mask, clip_coef)
    err = (value - returns).square()
    if vf_clip_coef is not None:
        old_value = batch["value"]
        clipped = old_value + (value - old_value).clamp(-vf_clip_coef, vf_clip_coef)
        err = torch.maximum(err, (clipped - returns).square())
    vf_loss = 0.5 * masked_mean(err, mask)
    loss = policy_loss + vf_coef * vf_loss
    if ent_coef:
        if entropy is None:
            raise ValueError(f"ppo_loss with ent_coef={ent_coef} needs the entropy; pass it, or ent_coef=0.")
        loss = loss - ent_coef * masked_mean(entropy, mask)
    return PPOTerms(loss, policy_loss.detach(), vf_loss.detach(), ratio.detach())


@torch.no_grad()
def ppo_statistics(
    terms: PPOTerms, entropy: torch.Tensor, mask: torch.Tensor | None, clip_coef: float
) -> dict[str, torch.Tensor]:
    """The diagnostics of one PPO minibatch step, by name."""
    approx_kl, clipfrac = policy_stats(terms.ratio, clip_coef, mask)
    return {
        "policy_loss": terms.policy_loss,
        "vf_loss": terms.vf_loss,
        "entropy": masked_mean(entropy, mask),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


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


def past_target_kl(approx_kl: torch.Tensor, target_kl: float | None) -> bool:
    """Whether an epoch's mean approximate KL (averaged over the data-parallel ranks so that they
    all stop at the same epoch) passed ``target_kl``: the policy moved too far from the one that
    collected the data, and the update stops early."""
    if target_kl is None:
        return False
    return distributed.average_(approx_kl.detach().reshape(1).clone()).item() > target_kl
