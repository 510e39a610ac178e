"""Network building blocks tuned for the small batches of on-policy RL on a CPU.

At these sizes (tens to hundreds of rows, 64 units) each torch op costs a few microseconds of
dispatch, more than its arithmetic, so the fewest ops win. ``StackedMLP`` runs the actor and
critic towers side by side as one batched matmul per layer, inside a single autograd node whose
backward is written out (four ops per layer instead of autograd's dozen). tanh is computed as
2 * sigmoid(2x) - 1: torch's CPU sigmoid kernel is several times faster than its tanh
(measured here: 14 us vs 86 us for a 2x256x64 block); below ``SMALL_BATCH`` rows, as in a
rollout step, one tanh_ op is cheaper than those three. tests/test_models.py checks both
against autograd with gradcheck.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _tanh_(h2: torch.Tensor) -> torch.Tensor:
    """tanh(x) from h2 = 2x (the layer's matmul produces 2x for free): 2 * sigmoid(2x) - 1."""
    return torch.sigmoid_(h2).mul_(2.0).sub_(1.0)


def _tanh_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.tanh_backward(grad, out)


def _relu_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0.0)


# activation name -> (in-place forward, backward from the activation's output, scale the layer
# applies to its pre-activation: tanh takes 2x, see _tanh_)
ACTIVATIONS = {"tanh": (_tanh_, _tanh_backward, 2.0), "relu": (torch.relu_, _relu_backward, 1.0)}
SMALL_BATCH = 16  # measured crossover of the two tanh forms for 2 x 64 units


def stacked_forward(x: torch.Tensor, activation: str, n_hidden: int, params) -> tuple[tuple, list]:
    """Head outputs per tower, and the hidden activations ``[k, B, h]`` the backward needs. ``x`` is
    ``[B, in]`` (every tower sees it) or ``[k, B, in]`` (one input per tower)."""
    act, _, scale = ACTIVATIONS[activation]
    if activation == "tanh" and x.shape[-2] <= SMALL_BATCH:
        act, scale = torch.tanh_, 1.0
    weights, biases = params[0:2 * n_hidden:2], params[1:2 * n_hidden:2]
    heads = params[2 * n_hidden:]
    h = _per_tower(x, weights[0].shape[0])
    hidden = []
    for w, b in zip(weights, biases):
        h = act(torch.baddbmm(b, h, w, beta=scale, alpha=scale))
        hidden.append(h)
    outs = tuple(torch.addmm(hb, h[k], hw.t()) for k, (hw, hb) in enumerate(zip(heads[0::2], heads[1::2])))
    return outs, hidden


def stacked_backward(x: torch.Tensor, activation: str, params, hidden: list, grad_outs, grads,
                     need_grad_x: bool = False) -> torch.Tensor | None:
    """The backward of ``stacked_forward``: writes each parameter's gradient into ``grads`` (same
    order as ``params``, overwritten, not accumulated); returns the input's gradient if asked.

    Shared by the autograd node and by the engine-free learn step (``ActorCritic.evaluate_backward``).
    """
    _, act_backward, _ = ACTIVATIONS[activation]
    n = len(hidden)
    weights, head_weights = params[0:2 * n:2], params[2 * n::2]
    last = hidden[-1]
    grad = torch.empty_like(last)
    for k, (g, hw) in enumerate(zip(grad_outs, head_weights)):
        torch.mm(g.t(), last[k], out=grads[2 * n + 2 * k])
        torch.sum(g, 0, out=grads[2 * n + 2 * k + 1])
        torch.mm(g, hw, out=grad[k])
    for i in reversed(range(n)):
        grad = act_backward(grad, hidden[i])
        inp = hidden[i - 1] if i > 0 else _per_tower(x, len(grad_outs))
        torch.bmm(inp.transpose(1, 2), grad, out=grads[2 * i])
        torch.sum(grad, 1, keepdim=True, out=grads[2 * i + 1])
        if i > 0:
            grad = torch.bmm(grad, weights[i].transpose(1, 2))
        elif need_grad_x:
            grad_x = torch.bmm(grad, weights[0].transpose(1, 2))
            return grad_x if x.dim() == 3 else grad_x.sum(0)
    return None


def _per_tower(x: torch.Tensor, towers: int) -> torch.Tensor:
    return x if x.dim() == 3 else x.unsqueeze(0).expand(towers, *x.shape)


class _StackedMLPFunction(torch.autograd.Function):
    """Forward and backward of ``StackedMLP``; the backward is autograd's, written out."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, activation: str, n_hidden: int, *params: torch.Tensor):
        outs, hidden = stacked_forward(x, activation, n_hidden, params)
        ctx.activation, ctx.n_hidden = activation, n_hidden
        ctx.save_for_backward(x, *params, *hidden)
        return outs

    @staticmethod
    def backward(ctx, *grad_outs: torch.Tensor):
        x, *saved = ctx.saved_tensors
        params, hidden = saved[:-ctx.n_hidden], saved[-ctx.n_hidden:]
        grads = [torch.empty_like(p) for p in params]
        grad_x = stacked_backward(x, ctx.activation, params, hidden, grad_outs, grads, ctx.needs_input_grad[0])
        return grad_x, None, None, *grads


class StackedMLP(nn.Module):
    """``k`` MLPs with the same hidden sizes, each with its own linear head, fed the same input
    ``[B, in]`` or one input each ``[k, B, in]`` (a critic that sees more than the actor).

    The hidden layers run as one ``baddbmm`` per layer over all towers; returns one output per
    tower, ``[B, out_dims[k]]``. Hidden weights are orthogonal with gain sqrt(2), heads with
    ``head_gains`` (0.01 for a policy, 1.0 for a value), biases zero (PPO detail #2).
    """

    def __init__(self, in_dim: int, hiddens: list[int], out_dims: list[int], head_gains: list[float],
                 activation: str = "tanh"):
        super().__init__()
        if not hiddens:
            raise ValueError("StackedMLP needs at least one hidden layer")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation '{activation}' is not one of {sorted(ACTIVATIONS)}")
        towers = len(out_dims)
        sizes = [in_dim, *hiddens]
        self.activation = activation
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            # orthogonal_ on each tower's [out, in] matrix, stored transposed for baddbmm
            w = torch.stack([_orthogonal(fan_out, fan_in, math.sqrt(2)).T for _ in range(towers)])
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(towers, 1, fan_out)))
        self.heads = nn.ModuleList(linear_head(hiddens[-1], d, g) for d, g in zip(out_dims, head_gains))
        self._params = [p for pair in zip(self.weights, self.biases) for p in pair]
        self._params += [p for head in self.heads for p in (head.weight, head.bias)]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if torch.is_grad_enabled():
            return _StackedMLPFunction.apply(x, self.activation, len(self.weights), *self._params)
        return stacked_forward(x, self.activation, len(self.weights), self._params)[0]  # rollout: no graph

    def forward_for_backward(self, x: torch.Tensor) -> tuple[tuple, list]:
        """Outputs without an autograd graph, plus the hidden activations ``backward_into_grad`` needs."""
        return stacked_forward(x, self.activation, len(self.weights), self._params)

    def backward_into_grad(self, x: torch.Tensor, hidden: list, grad_outs) -> None:
        """Write the gradient of the outputs (``grad_outs``, one per tower) into each parameter's ``.grad``."""
        stacked_backward(x, self.activation, self._params, hidden, grad_outs, [p.grad for p in self._params])


def _orthogonal(rows: int, cols: int, gain: float) -> torch.Tensor:
    return nn.init.orthogonal_(torch.empty(rows, cols), gain=gain)


def linear_head(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """A linear output layer, orthogonal init with the given gain (0.01 policy, 1.0 value)."""
    layer = nn.Linear(in_dim, out_dim)
    with torch.no_grad():
        layer.weight.copy_(_orthogonal(out_dim, in_dim, gain))
        layer.bias.zero_()
    return layer
