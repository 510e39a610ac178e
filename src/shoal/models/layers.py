"""Network building blocks tuned for the small batches of on-policy RL on a CPU.

At these sizes (tens to hundreds of rows, 64 units) each torch op costs a few microseconds of
dispatch, more than its arithmetic, so the fewest ops win. ``StackedMLP`` runs the actor and
critic towers side by side as one batched matmul per layer. Without autograd (the rollout, and
the hand-fused learn step in ``shoal.algos.ppo_fused``) tanh is computed as 2 * sigmoid(2x) - 1:
torch's CPU sigmoid kernel is several times faster than its tanh (measured here: 14 us vs 86 us
for a 2x256x64 block); below ``SMALL_BATCH`` rows, as in a rollout step, one tanh_ op is cheaper
than those three. Under autograd the plain ops run, so hooks, DDP and custom losses see an
ordinary graph.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import nn


def _tanh_(h2: torch.Tensor) -> torch.Tensor:
    """tanh(x) from h2 = 2x (the layer's matmul produces 2x for free): 2 * sigmoid(2x) - 1."""
    return torch.sigmoid_(h2).mul_(2.0).sub_(1.0)


# activation name -> (in-place forward without autograd, scale the layer applies to its
# pre-activation: tanh takes 2x, see _tanh_), and the module for plain networks
ACTIVATIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], float]] = {
    "tanh": (_tanh_, 2.0),
    "relu": (torch.relu_, 1.0),
}
ACTIVATION_MODULES = {"tanh": nn.Tanh, "relu": nn.ReLU}
SMALL_BATCH = 16  # measured crossover of the two tanh forms for 2 x 64 units


def stacked_forward(
    x: torch.Tensor, activation: str, n_hidden: int, params: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """Head outputs per tower, and the hidden activations ``[k, B, h]`` (which a hand-written
    backward needs), computed without autograd. ``x`` is ``[B, in]`` (every tower sees it) or
    ``[k, B, in]`` (one input per tower)."""
    act, scale = ACTIVATIONS[activation]
    if activation == "tanh" and x.shape[-2] <= SMALL_BATCH:
        act, scale = torch.tanh_, 1.0
    weights, biases = params[0 : 2 * n_hidden : 2], params[1 : 2 * n_hidden : 2]
    heads = params[2 * n_hidden :]
    h = per_tower(x, weights[0].shape[0])
    hidden = []
    for w, b in zip(weights, biases):
        h = act(torch.baddbmm(b, h, w, beta=scale, alpha=scale))
        hidden.append(h)
    outs = tuple(torch.addmm(hb, h[k], hw.t()) for k, (hw, hb) in enumerate(zip(heads[0::2], heads[1::2])))
    return outs, hidden


def per_tower(x: torch.Tensor, towers: int) -> torch.Tensor:
    return x if x.dim() == 3 else x.unsqueeze(0).expand(towers, *x.shape)


def _list_params(module: StackedMLP, incompatible_keys: object = None) -> None:
    """Fill ``StackedMLP.flat_params`` (also its hook after loading a state dict)."""
    params = [p for pair in zip(module.weights, module.biases) for p in pair]
    module.flat_params = params + [p for head in module.heads for p in (head.weight, head.bias)]


class StackedMLP(nn.Module):
    """``k`` MLPs with the same hidden sizes, each with its own linear head, fed the same input
    ``[B, in]`` or one input each ``[k, B, in]`` (a critic that sees more than the actor).

    The hidden layers run as one ``baddbmm`` per layer over all towers; returns one output per
    tower, ``[B, out_dims[k]]``. Hidden weights are orthogonal with gain sqrt(2), heads with
    ``head_gains`` (0.01 for a policy, 1.0 for a value), biases zero.
    """

    def __init__(
        self, in_dim: int, hiddens: list[int], out_dims: list[int], head_gains: list[float], activation: str = "tanh"
    ):
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
        for fan_in, fan_out in itertools.pairwise(sizes):
            # orthogonal_ on each tower's [out, in] matrix, stored transposed for baddbmm
            w = torch.stack([orthogonal(fan_out, fan_in, math.sqrt(2)).T for _ in range(towers)])
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(towers, 1, fan_out)))
        self.heads = nn.ModuleList(linear_head(hiddens[-1], d, g) for d, g in zip(out_dims, head_gains))
        self.flat_params: list[nn.Parameter] = []
        """Every parameter in the order stacked_forward takes them: (weight, bias) per layer, then per
        head; listed once, since walking the module lists costs more than a forward at rollout sizes,
        and listed again after a ``load_state_dict(assign=True)``, which puts new parameters in."""
        _list_params(self)
        self.register_load_state_dict_post_hook(_list_params)  # type: ignore[no-untyped-call]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not torch.is_grad_enabled():  # the rollout: no graph, the fast activations
            return stacked_forward(x, self.activation, len(self.weights), self.flat_params)[0]
        return self.forward_hidden(x)[0]

    def forward_hidden(self, x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The towers' outputs and their last hidden layer ``[k, B, h]`` (gSDE's features)."""
        if not torch.is_grad_enabled():
            outs, hidden = stacked_forward(x, self.activation, len(self.weights), self.flat_params)
            return outs, hidden[-1]
        h = self.trunk(x)
        return tuple(head(h[k]) for k, head in enumerate(self.heads)), h

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden layer of every tower, ``[k, B, h]``."""
        if not torch.is_grad_enabled():
            n_hidden = len(self.weights)
            return stacked_forward(x, self.activation, n_hidden, self.flat_params[: 2 * n_hidden])[1][-1]
        act = torch.tanh if self.activation == "tanh" else torch.relu
        h = per_tower(x, len(self.heads))
        for w, b in zip(self.weights, self.biases):
            h = act(torch.baddbmm(b, h, w))
        return h

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """Every tower's output as one tensor ``[k, B, out]``, for towers with one output size (twin
        critics): the heads run as one batched matmul, whose backward hands the hidden layer one
        gradient. Heads applied tower by tower would each scatter theirs into a zeroed copy of the
        whole ``[k, B, h]`` block, which costs about as much as a hidden layer's matmul. The heads'
        parameters are read here, so their modules' forward hooks do not run."""
        heads = cast(list[nn.Linear], list(self.heads))  # read at each call: parameters may be replaced
        weight = torch.stack([head.weight for head in heads])  # [k, out, h]
        bias = torch.stack([head.bias for head in heads]).unsqueeze(1)  # [k, 1, out]
        return torch.baddbmm(bias, self.trunk(x), weight.transpose(1, 2))

    def tower(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Tower ``k``'s output alone, from an input ``[B, in]`` that every tower sees: what
        ``forward(x)[k]`` gives under autograd, for a loss that reads one tower (TD3's actor) at
        a fraction of the work (without autograd ``forward``'s fast activations round differently)."""
        act = torch.tanh if self.activation == "tanh" else torch.relu
        h = x
        for w, b in zip(self.weights, self.biases):
            h = act(torch.addmm(b[k], h, w[k]))
        out: torch.Tensor = self.heads[k](h)
        return out


def orthogonal(rows: int, cols: int, gain: float) -> torch.Tensor:
    return nn.init.orthogonal_(torch.empty(rows, cols), gain=gain)


def linear_head(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """A linear output layer, orthogonal init with the given gain (0.01 policy, 1.0 value)."""
    layer = nn.Linear(in_dim, out_dim)
    with torch.no_grad():
        layer.weight.copy_(orthogonal(out_dim, in_dim, gain))
        layer.bias.zero_()
    return layer


def mlp(in_dim: int, hiddens: list[int], activation: str, layer_norm: bool = False) -> nn.Sequential:
    """Plain hidden layers (orthogonal init, gain sqrt(2)) for networks outside the stacked towers;
    ``layer_norm`` puts a LayerNorm between each layer and its activation."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip([in_dim, *hiddens[:-1]], hiddens):
        layers.append(linear_head(fan_in, fan_out, math.sqrt(2)))
        if layer_norm:
            layers.append(nn.LayerNorm(fan_out))
        layers.append(ACTIVATION_MODULES[activation]())
    return nn.Sequential(*layers)
