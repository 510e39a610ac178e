"""Action distributions as plain functions of the network's output.

No torch.distributions objects: building one per forward costs more than the math itself at
rollout batch sizes. Each class is stateless and works on batches of flat parameters.

Action masks (Discrete and MultiDiscrete): ``mask`` is a bool tensor shaped like the logits,
True = allowed; a MultiDiscrete mask is the sub-actions' masks concatenated (the
PettingZoo/Gymnasium convention). Disallowed logits are replaced by -sqrt(finfo.max), -1.8e19 in
float32: their probability is exactly 0, so every 0 * log p term is 0. Not -inf (0 * -inf is
NaN) and not finfo.min either: the entropy's gradient multiplies log p by its upstream gradient,
which overflows to inf (then 0 * inf = NaN) once that gradient exceeds 1.
A row (or a MultiDiscrete segment) with no allowed action is treated as unmasked: such rows are
padding (dead agents, excluded from the loss by ``valid``) and must stay finite; on a valid row
it is the caller's bug, and it is not checked for (that would cost a sync per call).
``mask=None`` runs exactly the unmasked code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch

from shoal.envs.spaces import ActionSpec

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _check_mask(mask: torch.Tensor, logits: torch.Tensor, expected: str) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"action_mask must be a bool tensor (True = allowed), got dtype {mask.dtype}")
    if mask.shape != logits.shape:
        raise ValueError(f"action_mask has shape {tuple(mask.shape)}, expected {tuple(logits.shape)} ({expected})")


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None, expected: str) -> torch.Tensor:
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

    def log_probs(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities of every action ``[B, n]`` under the mask."""
        return masked_logits(logits, mask, f"[batch, {self.param_dim}]").log_softmax(-1)

    def sample(
        self, logits: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logp = self.log_probs(logits, mask)
        if deterministic:
            action = logp.argmax(-1, keepdim=True)
        else:
            # Gumbel-max: argmax(logp + G) with G = -log(Exp(1)) is an exact sample, and half the
            # cost of torch.multinomial at rollout batch sizes. exponential_ never returns 0 (torch
            # >= 2.1), so G stays below ~104 and a masked logp near -1.8e19 can never win.
            action = (logp - torch.empty_like(logp).exponential_().log_()).argmax(-1, keepdim=True)
        return action.squeeze(-1), logp.gather(-1, action).squeeze(-1)

    def log_prob_entropy(
        self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probability of ``action`` and the entropy (None unless asked for)."""
        logp = self.log_probs(logits, mask)
        ent = -(logp.exp() * logp).sum(-1) if entropy else None  # masked: p = 0 exactly, p * logp = 0
        return logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), ent


class MultiCategorical:
    """Independent Discrete actions from concatenated logits ``[B, sum(nvec)]``."""

    def __init__(self, nvec: tuple[int, ...]):
        self.nvec = list(nvec)
        self.param_dim = sum(nvec)
        self.parts = [Categorical(n) for n in nvec]

    def sample(
        self, logits: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [p.sample(x, deterministic, m) for p, x, m in self.split(logits, mask)]
        return torch.stack([a for a, _ in pairs], -1), cast(torch.Tensor, sum(lp for _, lp in pairs))

    def log_prob_entropy(
        self, logits: torch.Tensor, action: torch.Tensor, entropy: bool = True, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        parts = [
            p.log_prob_entropy(x, a, entropy, m) for (p, x, m), a in zip(self.split(logits, mask), action.unbind(-1))
        ]
        logp = cast(torch.Tensor, sum(lp for lp, _ in parts))
        if not entropy:
            return logp, None
        return logp, cast(torch.Tensor, sum(cast("list[torch.Tensor]", [e for _, e in parts])))  # each part gave one

    def split(
        self, logits: torch.Tensor, mask: torch.Tensor | None
    ) -> list[tuple[Categorical, torch.Tensor, torch.Tensor | None]]:
        """``(part, logits, mask)`` per sub-action. The mask is checked whole, so a wrong width is
        reported against sum(nvec) rather than as a bad split."""
        masks: Sequence[torch.Tensor | None]
        if mask is None:
            masks = [None] * len(self.parts)
        else:
            _check_mask(mask, logits, f"[batch, sum(nvec)] = [batch, {self.param_dim}] for nvec {self.nvec}")
            masks = mask.split_with_sizes(self.nvec, -1)  # what Tensor.split does with a list of sizes
        return list(zip(self.parts, logits.split_with_sizes(self.nvec, -1), masks))


class DiagGaussian:
    """A Box action from ``mean [B, d]`` and a state-independent ``log_std [d]`` (or one per row,
    ``[B, d]``, as gSDE's)."""

    def __init__(self, dim: int):
        self.param_dim = dim

    @staticmethod
    def log_density(z: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """log N(a; mean, std) summed over dims, from the standardized action z = (a - mean) / std."""
        return -(0.5 * z.square() + log_std + LOG_SQRT_2PI).sum(-1)

    def sample(
        self, mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.zeros_like(mean) if deterministic else torch.randn_like(mean)
        return mean + noise * log_std.exp(), self.log_density(noise, log_std)

    @staticmethod
    def entropy(log_std: torch.Tensor, batch: int) -> torch.Tensor:
        return (log_std + 0.5 + LOG_SQRT_2PI).sum(-1).expand(batch)

    @staticmethod
    def log_prob_entropy(
        mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor, entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        z = (action - mean) * (-log_std).exp()
        logp = DiagGaussian.log_density(z, log_std)
        return logp, DiagGaussian.entropy(log_std, mean.shape[0]) if entropy else None


def make_distribution(spec: ActionSpec) -> Categorical | MultiCategorical | DiagGaussian:
    if spec.kind == "discrete":
        return Categorical(spec.nvec[0])
    if spec.kind == "multi_discrete":
        return MultiCategorical(spec.nvec)
    return DiagGaussian(spec.shape[0])
