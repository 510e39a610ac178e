"""Keep every parameter (and its gradient) as a view into one flat tensor, and step it with Adam.

Why by hand: torch.optim.Adam and clip_grad_norm_ are general over lists of tensors, and their
Python bookkeeping costs more than the math on a small network (measured 75 us per PPO
minibatch). With one flat tensor, clipping is a norm and a scale, and Adam is one call of the
fused kernel torch.optim.Adam(fused=True) itself uses (12 us together).
tests/test_models.py checks FlatAdam against torch.optim.Adam.
"""

from __future__ import annotations

import torch
from torch import nn


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Re-home ``module``'s parameters into one flat Parameter whose ``.grad`` is the flat gradient.

    Autograd keeps accumulating into the per-parameter ``.grad`` views, so the flat gradient is
    always current; zero it with ``flat.grad.zero_()`` (never set grads to None).
    """
    params = [p for p in module.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    flat = nn.Parameter(torch.zeros(total, dtype=params[0].dtype, device=params[0].device))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.reshape(-1))
            p.data = flat.data[offset:offset + n].view_as(p)
            p.grad = flat.grad[offset:offset + n].view_as(p)
            offset += n
    return flat


class FlatAdam:
    """Adam (Kingma & Ba 2014, arXiv:1412.6980) on one flat parameter, with global grad-norm clipping."""

    def __init__(self, param: nn.Parameter, lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)):
        self.param, self.lr, self.eps, self.betas = param, lr, eps, betas
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        self.step_count = torch.zeros((), dtype=torch.float32, device=param.device)

    def zero_grad(self) -> None:
        self.param.grad.zero_()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale the gradient so its global L2 norm is at most ``max_norm``; returns the norm before."""
        grad = self.param.grad
        norm = grad.norm().item()  # a host float: on the CPU this costs nothing and saves three ops
        if norm > max_norm:
            grad.mul_(max_norm / (norm + 1e-6))
        return norm

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        self.step_count += 1  # the kernel reads the incremented count for bias correction
        torch._fused_adam_([self.param], [self.param.grad], [self.exp_avg], [self.exp_avg_sq], [], [self.step_count],
                           lr=self.lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=self.eps,
                           amsgrad=False, maximize=False)

    def state_dict(self) -> dict[str, torch.Tensor | float]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.step_count, "lr": self.lr}

    def load_state_dict(self, state: dict[str, torch.Tensor | float]) -> None:
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count.copy_(state["step"])
        self.lr = float(state["lr"])
