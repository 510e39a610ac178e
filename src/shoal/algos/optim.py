"""The optimizer step every autograd learner in shoal takes, and the target networks of replay learners."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
from torch import nn

from shoal import distributed
from shoal.errors import TrainingDiverged


class AutogradOptimizer:
    """Adam on autograd (any model, hooks and all): gradients of the minibatches of one optimizer
    step add up (``backward``), then one clip of their global norm and one Adam step (``step``).
    With several data-parallel ranks the gradients are averaged over them first. ``rectified``
    takes RAdam's step instead of Adam's (Liu et al. 2020: no large steps while the second-moment
    estimate is young).

    A step whose loss or gradient norm is not finite is not taken: it raises ``TrainingDiverged``
    naming ``owner`` (the policy id, and which of its networks), so the parameters stay as they
    were. That costs one host read of a scalar per step (on a GPU, one synchronization)."""

    def __init__(
        self,
        params: nn.Module | list[nn.Parameter],
        lr: float,
        eps: float,
        max_grad_norm: float | None,
        owner: str = "",
        part: str = "",
        rectified: bool = False,
    ):
        self.max_grad_norm = max_grad_norm
        self.owner, self.part = owner, part
        self.params = [p for p in (params.parameters() if isinstance(params, nn.Module) else params) if p.requires_grad]
        self.optimizer: torch.optim.Optimizer
        if rectified:  # torch has no fused RAdam; foreach is its fastest
            self.optimizer = torch.optim.RAdam(self.params, lr=lr, eps=eps, foreach=True)
        else:
            self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=eps, fused=True)
        self._fresh = True  # the next backward starts a new optimizer step
        self._loss = torch.zeros((), device=self.params[0].device)  # this step's losses, summed

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
            self._loss.zero_()
            self._fresh = False
        self._loss += loss.detach()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def step(self) -> None:
        try:
            if distributed.world_size() > 1:
                self._average_gradients()
            if self.max_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            else:
                norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
            if not bool(torch.isfinite(self._loss + norm)):  # one read: NaN or inf in either
                raise non_finite_step(self.owner, self.part, float(self._loss), float(norm))
            self.optimizer.step()
        finally:  # taken or not (diverged, interrupted), the next backward starts a new step
            self._fresh = True

    def _average_gradients(self) -> None:
        """One all-reduce of every gradient, flattened, with a flag per parameter saying whether any
        rank's loss reached it: a parameter no rank reached keeps no gradient, so Adam skips it as
        it would in one process (elsewhere a missing gradient counts as 0)."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        reached = torch.tensor([p.grad is not None for p in self.params], dtype=grads[0].dtype, device=grads[0].device)
        flat = distributed.sum_(torch.cat([*(g.reshape(-1) for g in grads), reached]))
        parts = flat.split_with_sizes([*(g.numel() for g in grads), len(grads)])
        for p, part, count in zip(self.params, parts, parts[-1].tolist()):
            p.grad = part.view_as(p).div_(distributed.world_size()) if count else None

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The moments and step counts of ``state``; the settings (``eps``, the step size) stay
        this optimizer's, as its config gives them: torch's loader would take the saved ones, so
        a resume or a population move with another ``adam_eps`` would go on with the old."""
        settings = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state)
        for group, own in zip(self.optimizer.param_groups, settings):
            group.update(own)


def non_finite_step(owner: str, part: str, loss: float, grad_norm: float) -> TrainingDiverged:
    """The error of an optimizer step not taken."""
    where = f" ({part})" if part else ""
    values = f"loss {loss:g}, gradient norm {grad_norm:g}"
    return TrainingDiverged(f"the update{where} was not finite ({values}), so it was not applied.", owner or None)


class TargetNetwork:
    """A frozen copy of a network that follows it slowly, as replay learners' targets do:
    ``update(tau)`` moves every float tensor by ``tau`` toward the online network's (1.0 copies)."""

    def __init__(self, online: nn.Module):
        self.online = online
        self.module = copy.deepcopy(online).requires_grad_(False)

    def __call__(self, *args: Any) -> Any:
        return self.module(*args)

    @torch.no_grad()
    def update(self, tau: float) -> None:
        """``target <- tau * online + (1 - tau) * target`` (integer buffers are copied). The tensors
        are looked up at each update, so the target keeps following an online network whose tensors
        were replaced (moved to another device, loaded with ``assign=True``)."""
        targets = itertools.chain(self.module.parameters(), self.module.buffers())
        moved: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        for target, source in zip(targets, itertools.chain(self.online.parameters(), self.online.buffers())):
            if tau < 1.0 and target.is_floating_point():
                moved[0].append(target)
                moved[1].append(source)
            else:
                target.copy_(source)
        if moved[0]:  # one op for all of them: a replay learner moves its targets after every step
            torch._foreach_lerp_(moved[0], moved[1], tau)

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)
