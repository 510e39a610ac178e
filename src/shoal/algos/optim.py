"""The optimizer step every autograd learner in shoal takes."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class AutogradOptimizer:
    """Adam on autograd (any model, hooks and all): gradients of the minibatches of one optimizer
    step add up (``backward``), then one clip of their global norm and one Adam step (``step``)."""

    def __init__(self, module: nn.Module, lr: float, eps: float, max_grad_norm: float | None):
        self.max_grad_norm = max_grad_norm
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=eps, fused=True)
        self._fresh = True  # the next backward starts a new optimizer step

    @property
    def lr(self) -> float:
        lr: float = self.optimizer.param_groups[0]["lr"]
        return lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.param_groups[0]["lr"] = value

    def backward(self, loss: torch.Tensor) -> None:
        if self._fresh:
            self.optimizer.zero_grad()
            self._fresh = False
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def step(self) -> None:
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self._fresh = True

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
