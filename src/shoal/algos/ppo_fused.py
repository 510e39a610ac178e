"""PPO's learn step for the built-in MLP actor-critic with the backward pass written out.

The one place in shoal that bypasses autograd. On the small networks and minibatches of classic
control (64 units, 256 rows) each autograd node costs a few microseconds of bookkeeping, more
than its arithmetic: the forward pass, the PPO loss and their written-out gradients here, with
every parameter a view into one flat tensor stepped by torch's fused Adam kernel, make a
minibatch step about twice as fast (measured on these 2-core CPUs: 196k vs 105k samples/s at
minibatch 256, 349k vs 337k at 4096).

It is used only where it is exactly the plain path (``fused_unavailable`` says why not
otherwise): ``ActorCriticPolicy`` over the built-in ``MLPModel``, no hooks on its modules or
parameters (they would not fire here), and ``fused_update`` left on. Custom models, hooks and
gradient accumulation run on autograd; data-parallel ranks average this step's gradient
themselves (``_adam``) before stepping. tests/test_fused.py checks one
whole PPO update against the autograd path (the same parameters to 1e-6) and each backward
against autograd.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict
from torch import nn
from typing_extensions import Unpack

from shoal import distributed
from shoal.algos.losses import PPOCoefficients, PPOTerms
from shoal.algos.optim import non_finite_step
from shoal.models.distributions import Categorical, DiagGaussian
from shoal.models.layers import per_tower, stacked_forward
from shoal.models.networks import MLPModel
from shoal.models.policy import BOX_MASK_ERROR, ActorCriticPolicy


def fused_unavailable(policy: nn.Module, fused_update: bool) -> str | None:
    """Why the fused step cannot serve ``policy`` (None: it can)."""
    if not fused_update:
        return "fused_update is off"
    if type(policy) is not ActorCriticPolicy or type(policy.model) is not MLPModel:
        return "the policy is not the built-in MLP actor-critic"
    # torch has no public way to list hooks; these are the dicts register_*_hook fills
    for module in policy.modules():
        if any(
            getattr(module, name)
            for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        ):
            return f"{type(module).__name__} has hooks"
    for param in policy.parameters():
        if param._backward_hooks or getattr(param, "_post_accumulate_grad_hooks", None):
            return "a parameter has hooks"
    return None


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Re-home ``module``'s parameters into one flat Parameter whose ``.grad`` is the flat gradient.

    Every parameter (and its ``.grad``) becomes a view into the flat tensor, so the module, the
    collector acting with it and the optimizer all see the same memory.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    flat = nn.Parameter(torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.reshape(-1))
            p.data = flat.data[offset : offset + n].view_as(p)
            p.grad = flat.grad[offset : offset + n].view_as(p)
            offset += n
    return flat


class FusedPPOStep:
    """One PPO minibatch step: forward, loss, written-out backward, clip, Adam (Kingma & Ba 2014,
    arXiv:1412.6980) on the flat parameter. Called as ``ppo_loss`` is, less the policy's outputs,
    which it computes itself."""

    def __init__(self, policy: ActorCriticPolicy, lr: float, eps: float, max_grad_norm: float | None):
        self.policy, self.lr, self.eps, self.max_grad_norm = policy, lr, eps, max_grad_norm
        assert isinstance(policy.model, MLPModel)  # fused_unavailable checked the model
        self.net = policy.model
        self.n_hidden = len(self.net.weights)
        self.flat = flatten_parameters(policy)
        assert self.flat.grad is not None  # flatten_parameters gives it one
        self.grad = self.flat.grad
        """The flat gradient, of which every parameter's ``.grad`` is a view."""
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.step_count = torch.zeros((), dtype=self.flat.dtype, device=self.flat.device)

    @torch.no_grad()
    def __call__(
        self,
        batch: TensorDict,
        *,
        mask: torch.Tensor | None,
        track: bool,
        need_entropy: bool,
        **coefficients: Unpack[PPOCoefficients],
    ) -> tuple[PPOTerms | None, torch.Tensor | None]:
        """Step on ``batch`` (the fields ``ppo_loss`` reads, and ``obs``, ``action``, optionally
        ``action_mask`` and ``critic_obs``); returns ``ppo_loss``'s terms (None unless ``track``)
        and the entropy (None unless ``need_entropy``)."""
        policy, net = self.policy, self.net
        params = net.flat_params
        obs, critic_obs = policy.normalize(batch["obs"], batch.get("critic_obs", None))
        x = net.inputs(obs, critic_obs)
        (dist_inputs, value), hidden = stacked_forward(x, net.activation, self.n_hidden, params)
        logp, ent, ctx = _dist_forward(
            policy, dist_inputs, batch["action"], need_entropy, batch.get("action_mask", None)
        )
        value = value.squeeze(-1)

        def loss_and_grad(with_values: bool) -> tuple[PPOTerms | None, Gradients]:
            return ppo_loss_and_grad(
                batch, log_prob=logp, value=value, entropy=ent, mask=mask, with_values=with_values, **coefficients
            )

        terms, (grad_logp, grad_value, grad_ent) = loss_and_grad(track)
        grad_dist = _dist_backward(policy, ctx, grad_logp, grad_ent)
        grads = [p.grad for p in params if p.grad is not None]  # views into the flat gradient: all of them
        stacked_backward(x, net.activation, params, hidden, (grad_dist, grad_value.unsqueeze(-1)), grads)

        def loss() -> float:  # computed only to report a step that is not taken
            values = terms if terms is not None else loss_and_grad(True)[0]
            return float("nan") if values is None else float(values.loss)

        self._adam(loss)
        return terms, ent

    def _adam(self, loss: Callable[[], float]) -> None:
        grad = self.grad
        distributed.average_(grad)  # several data-parallel ranks: their mean gradient
        norm = grad.norm().item()  # a host float: on the CPU this costs nothing and saves three ops
        if not math.isfinite(norm):  # a non-finite loss reaches every gradient: the step is not taken
            raise non_finite_step(self.policy.policy_id, "", loss(), norm)
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            grad.mul_(self.max_grad_norm / (norm + 1e-6))
        self.step_count += 1  # the kernel reads the incremented count for bias correction
        # The kernel torch.optim.Adam(fused=True) runs, called directly: Adam.step() costs 84 us
        # per call here and the public functional torch.optim.adam.adam 33 us, against 16 us
        # (one flat parameter; ~7% of a CartPole iteration at the zoo settings).
        torch._fused_adam_(
            [self.flat],
            [grad],
            [self.exp_avg],
            [self.exp_avg_sq],
            [],
            [self.step_count],
            lr=self.lr,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count.copy_(state["step"])


# ----- the action distributions: log-probability, entropy, and their gradients ----------------
# What each distribution's forward keeps for its backward
class GaussianContext(NamedTuple):
    z: torch.Tensor
    """``(action - mean) / std``."""
    inv_std: torch.Tensor


class CategoricalContext(NamedTuple):
    logp: torch.Tensor
    """The log-probabilities of every action."""
    taken: torch.Tensor
    """The index of the action taken, ``[B, 1]``."""
    entropy: torch.Tensor | None


DistContext = GaussianContext | CategoricalContext | list[CategoricalContext]  # the last: MultiCategorical's parts


def _dist_forward(
    policy: ActorCriticPolicy, dist_inputs: torch.Tensor, action: torch.Tensor, entropy: bool, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, DistContext]:
    """Log-probability of ``action``, entropy (None unless asked for), and the backward's context."""
    dist = policy.dist
    if isinstance(dist, DiagGaussian):
        if mask is not None:
            raise ValueError(BOX_MASK_ERROR)
        inv_std = (-policy.log_std).exp()
        z = (action - dist_inputs) * inv_std
        ent = dist.entropy(policy.log_std, len(dist_inputs)) if entropy else None
        return dist.log_density(z, policy.log_std), ent, GaussianContext(z, inv_std)
    if isinstance(dist, Categorical):
        return _categorical_forward(dist, dist_inputs, action, entropy, mask)
    parts = [
        _categorical_forward(p, x, a, entropy, m)
        for (p, x, m), a in zip(dist.split(dist_inputs, mask), action.unbind(-1))
    ]
    entropies = [e for _, e, _ in parts if e is not None]
    ent = functools.reduce(operator.add, entropies) if entropies else None
    return functools.reduce(operator.add, [lp for lp, _, _ in parts]), ent, [c for _, _, c in parts]


def _categorical_forward(
    dist: Categorical, logits: torch.Tensor, action: torch.Tensor, entropy: bool, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, CategoricalContext]:
    logp = dist.log_probs(logits, mask)
    ent = -(logp.exp() * logp).sum(-1) if entropy else None
    index = action.unsqueeze(-1)
    return logp.gather(-1, index).squeeze(-1), ent, CategoricalContext(logp, index, ent)


def _dist_backward(
    policy: ActorCriticPolicy, ctx: DistContext, grad_logp: torch.Tensor, grad_ent: torch.Tensor | None
) -> torch.Tensor:
    """Gradient wrt the distribution inputs (the log-std's is written into its ``.grad``). ``ctx``
    is what ``_dist_forward`` returned for the same distribution."""
    if isinstance(ctx, GaussianContext):
        # With z = (a - mean) / std: d logp / d mean = z / std, d logp / d log_std = z^2 - 1, dH / d log_std = 1.
        g = grad_logp.unsqueeze(-1)
        grad_log_std = (g * (ctx.z.square() - 1.0)).sum(0)
        if grad_ent is not None:
            grad_log_std += grad_ent.sum()
        assert policy.log_std.grad is not None  # a view into the flat gradient
        policy.log_std.grad.copy_(grad_log_std)
        return g * ctx.z * ctx.inv_std
    if isinstance(ctx, list):  # MultiCategorical: log-prob and entropy are sums over the parts
        return torch.cat([_categorical_backward(part, grad_logp, grad_ent) for part in ctx], -1)
    return _categorical_backward(ctx, grad_logp, grad_ent)


def _categorical_backward(
    ctx: CategoricalContext, grad_logp: torch.Tensor, grad_ent: torch.Tensor | None
) -> torch.Tensor:
    """With p = softmax, l = log p, H = -sum p l: d l_a / dz = onehot(a) - p and dH / dz = -p (l + H).
    A masked logit has p = 0 exactly, so its gradient is 0 (its action is never the one taken)."""
    logp, index, ent = ctx
    coef = grad_logp.unsqueeze(-1)
    if grad_ent is not None and ent is not None:  # a gradient for the entropy: the forward computed it
        coef = coef + grad_ent.unsqueeze(-1) * (logp + ent.unsqueeze(-1))
    grad = logp.exp().mul_(coef).neg_()
    return grad.scatter_add_(-1, index, grad_logp.unsqueeze(-1))


# ----- the PPO loss and its gradient (the same loss as losses.ppo_loss) ---------------------------
def _row_weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | float:
    if mask is None:
        return 1.0 / like.shape[0]
    m = mask.to(like.dtype)
    return m / m.sum().clamp_min(1.0)


Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # of the loss wrt (log_prob, value, entropy)


def ppo_loss_and_grad(
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
    with_values: bool = True,
) -> tuple[PPOTerms | None, Gradients]:
    """``ppo_loss``'s terms (None unless ``with_values``: the loss values are only diagnostics,
    half the ops) and the loss's gradient wrt ``(log_prob, value, entropy)`` (the entropy's is
    None when ``ent_coef`` is 0 or ``entropy`` is None)."""
    logp, old_logp, adv = log_prob, batch["sample_log_prob"], batch["advantage"]
    old_value, returns = batch["value"], batch["return"]
    w = _row_weights(mask, logp)
    ratio = (logp - old_logp).exp()
    surr = -adv * ratio
    surr_clipped = -adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    # Inside the clip range both terms are equal and both carry the gradient -A r; outside it
    # only the unclipped term does, and only when it is the larger.
    grad_logp = torch.where(surr >= surr_clipped, surr, 0.0).mul_(w)  # d(-A r)/d logp = -A r
    diff = value - returns
    if vf_clip_coef is None:
        v_grad = v_err = diff
    else:
        delta = value - old_value
        diff_clipped = old_value + delta.clamp(-vf_clip_coef, vf_clip_coef) - returns
        use_plain = diff.square() >= diff_clipped.square()
        v_grad = torch.where(use_plain, diff, diff_clipped * (delta.abs() < vf_clip_coef))
        v_err = torch.where(use_plain, diff, diff_clipped)
    grad_value = v_grad * (vf_coef * w)
    grad_ent = torch.full_like(surr, -ent_coef) * w if ent_coef and entropy is not None else None
    if not with_values:
        return None, (grad_logp, grad_value, grad_ent)
    pg_loss = (torch.maximum(surr, surr_clipped) * w).sum()
    v_loss = 0.5 * (v_err.square() * w).sum()
    loss = pg_loss + vf_coef * v_loss
    if ent_coef:
        if entropy is None:
            raise ValueError(f"ppo_loss_and_grad with ent_coef={ent_coef} needs the entropy; pass it, or ent_coef=0.")
        loss = loss - ent_coef * (entropy * w).sum()
    return PPOTerms(loss, pg_loss, v_loss, ratio), (grad_logp, grad_value, grad_ent)


# ----- the stacked towers' backward --------------------------------------------------------------
# The activations' own backward kernels, which autograd runs too: one pass where the public ops
# take several (a [2, 256, 64] gradient, one thread: 9.2 us against 24.5 us for g * (1 - y * y),
# and 10.0 us against 38.2 us for torch.where(y > 0, g, 0)).
# (torch.ops are looked up at run time, so the checker sees them as Any: the results are annotated)
def _tanh_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.aten.tanh_backward(grad, out)
    return result


def _relu_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.aten.threshold_backward(grad, out, 0.0)
    return result


ACTIVATION_BACKWARD = {"tanh": _tanh_backward, "relu": _relu_backward}  # from the activation's output


def stacked_backward(
    x: torch.Tensor,
    activation: str,
    params: Sequence[torch.Tensor],
    hidden: list[torch.Tensor],
    grad_outs: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
) -> None:
    """The backward of ``stacked_forward``: writes each parameter's gradient into ``grads`` (same
    order as ``params``, overwritten, not accumulated)."""
    act_backward = ACTIVATION_BACKWARD[activation]
    n = len(hidden)
    weights, head_weights = params[0 : 2 * n : 2], params[2 * n :: 2]
    last = hidden[-1]
    grad = torch.empty_like(last)
    for k, (g, hw) in enumerate(zip(grad_outs, head_weights)):
        torch.mm(g.t(), last[k], out=grads[2 * n + 2 * k])
        torch.sum(g, 0, out=grads[2 * n + 2 * k + 1])
        torch.mm(g, hw, out=grad[k])
    for i in reversed(range(n)):
        grad = act_backward(grad, hidden[i])
        inp = hidden[i - 1] if i > 0 else per_tower(x, len(grad_outs))
        torch.bmm(inp.transpose(1, 2), grad, out=grads[2 * i])
        torch.sum(grad, 1, keepdim=True, out=grads[2 * i + 1])
        if i > 0:
            grad = torch.bmm(grad, weights[i].transpose(1, 2))
