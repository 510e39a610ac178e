"""PPO's loss as one function (Schulman et al. 2017, arXiv:1707.06347), plus its diagnostics.

    L = mean_w[ max(-A r, -A clip(r, 1-c, 1+c)) ]                      clipped surrogate
      + vf_coef * 0.5 * mean_w[ max((V - R)^2, (V_clip - R)^2) ]       value, optionally clipped
      - ent_coef * mean_w[ H ]                                          entropy bonus
    r = exp(logp - logp_old),  V_clip = V_old + clip(V - V_old, -c_v, c_v)

``mean_w`` is the mean over valid rows (``mask``; None = all rows). The terms are combined in one
autograd node with the gradient written out: autograd's version is ~20 nodes of a few
microseconds each, a third of a PPO minibatch step on a small network. tests/test_losses.py
checks value and gradients against a per-element Python loop.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def _row_weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | float:
    if mask is None:
        return 1.0 / like.shape[0]
    m = mask.to(like.dtype)
    return m / m.sum().clamp_min(1.0)


def normalize_advantage(adv: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-8) -> torch.Tensor:
    """(adv - mean) / (std + eps) over the valid rows of a minibatch (PPO detail #7)."""
    if mask is None:
        return (adv - adv.mean()) / (adv.std() + eps)
    mean = masked_mean(adv, mask)
    var = masked_mean((adv - mean).square(), mask)
    return (adv - mean) / (var.sqrt() + eps)


def _ppo_forward(logp, value, entropy, old_logp, adv, old_value, returns, weights, clip_coef, vf_clip_coef,
                 vf_coef, ent_coef, with_values: bool = True):
    """``(loss, ratio, pg_loss, v_loss)`` (None unless ``with_values``) and what ``_ppo_backward`` needs."""
    ratio = (logp - old_logp).exp()
    neg_adv = -adv
    surr = neg_adv * ratio
    surr_clipped = neg_adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    # Inside the clip range both terms are equal and both carry the gradient -A r; outside it
    # only the unclipped term does, and only when it is the larger.
    unclipped = surr >= surr_clipped

    diff = value - returns
    if vf_clip_coef is None:
        v_grad = v_err = diff
    else:
        delta = value - old_value
        diff_clipped = old_value + delta.clamp(-vf_clip_coef, vf_clip_coef) - returns
        use_plain = diff.square() >= diff_clipped.square()
        v_grad = torch.where(use_plain, diff, diff_clipped * (delta.abs() < vf_clip_coef))
        v_err = torch.where(use_plain, diff, diff_clipped)
    saved = (surr, unclipped, v_grad)
    if not with_values:  # the gradient alone: the loss values are diagnostics, half the ops
        return None, saved

    pg_loss = (torch.maximum(surr, surr_clipped) * weights).sum()
    v_loss = 0.5 * (v_err.square() * weights).sum()
    loss = pg_loss + vf_coef * v_loss
    if ent_coef:
        loss = loss - ent_coef * (entropy * weights).sum()
    return (loss, ratio, pg_loss, v_loss), saved


def _ppo_backward(saved, w, vf_coef: float, ent_coef: float, need_entropy_grad: bool):
    """Gradients of the loss wrt logp, value and entropy; ``w`` is the row weights times d(output)/d(loss)."""
    surr, unclipped, v_grad = saved
    grad_logp = torch.where(unclipped, surr, 0.0).mul_(w)  # d(-A r)/d logp = -A r
    grad_value = v_grad * (vf_coef * w)
    grad_entropy = None
    if need_entropy_grad and ent_coef:
        grad_entropy = torch.full_like(surr, -ent_coef) * w
    return grad_logp, grad_value, grad_entropy


class _PPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, value, entropy, *args):
        outputs, saved = _ppo_forward(logp, value, entropy, *args)
        weights, _, _, vf_coef, ent_coef = args[4:]
        ctx.save_for_backward(*saved)
        ctx.weights, ctx.vf_coef, ctx.ent_coef = weights, vf_coef, ent_coef
        ctx.mark_non_differentiable(*outputs[1:])
        return outputs

    @staticmethod
    def backward(ctx, grad, *_):
        grads = _ppo_backward(ctx.saved_tensors, grad * ctx.weights, ctx.vf_coef, ctx.ent_coef, ctx.needs_input_grad[2])
        return *grads, *([None] * 9)


def ppo_loss(logp: torch.Tensor, value: torch.Tensor, entropy: torch.Tensor | None, old_logp: torch.Tensor,
             adv: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None,
             clip_coef: float, vf_clip_coef: float | None, vf_coef: float, ent_coef: float):
    """PPO's total loss; also returns the ratio, the policy loss and the value loss (no gradient).

    ``entropy`` may be None when ``ent_coef`` is 0."""
    weights = _row_weights(mask, logp)
    return _PPOLoss.apply(logp, value, entropy, old_logp, adv, old_value, returns, weights, clip_coef,
                          vf_clip_coef, vf_coef, ent_coef)


def ppo_loss_and_grad(logp: torch.Tensor, value: torch.Tensor, entropy: torch.Tensor | None, old_logp: torch.Tensor,
                      adv: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None,
                      clip_coef: float, vf_clip_coef: float | None, vf_coef: float, ent_coef: float,
                      with_values: bool = True):
    """``ppo_loss``'s outputs without autograd (None unless ``with_values``), and the loss's gradient
    wrt ``(logp, value, entropy)`` (the entropy's is None when ``ent_coef`` is 0)."""
    weights = _row_weights(mask, logp)
    outputs, saved = _ppo_forward(logp, value, entropy, old_logp, adv, old_value, returns, weights, clip_coef,
                                  vf_clip_coef, vf_coef, ent_coef, with_values)
    return outputs, _ppo_backward(saved, weights, vf_coef, ent_coef, entropy is not None)


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
