"""Running statistics for observation normalization and reward scaling, as PPO
implementations commonly apply them.

Updated in place from whole batches with the parallel-variance formula (Chan et al.), so the
rollout loop allocates nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from shoal import distributed


class RunningMeanStd(nn.Module):
    # buffers (registered in __init__, so they follow .to() and the state dict)
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = (), eps: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, across_ranks: bool = False) -> None:
        """Fold the batch ``x`` (rows along dim 0) in; ``across_ranks``: every data-parallel rank's
        batch, so that the ranks keep equal statistics (each rank must then call it)."""
        x = x.double()
        if across_ranks and distributed.world_size() > 1:
            moments = distributed.sum_(
                torch.cat([x.new_tensor([x.shape[0]]), x.sum(0).reshape(-1), x.square().sum(0).reshape(-1)])
            )
            n = int(moments[0].item())
            if n == 0:
                return
            batch_mean, squares = (part.view_as(self.mean) / n for part in moments[1:].chunk(2))
            batch_var = (squares - batch_mean.square()).clamp_min(0.0)
        else:
            n = x.shape[0]
            batch_mean = x.mean(0)
            batch_var = x.var(0, unbiased=False)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean.add_(delta * (n / total))
        self.var.mul_(self.count / total).add_(batch_var * (n / total) + delta.square() * (self.count * n / total**2))
        self.count.copy_(total)


class ObsNormalizer(nn.Module):
    """(obs - mean) / std, clipped to [-clip, clip]."""

    def __init__(self, shape: tuple[int, ...], clip: float, eps: float = 1e-8):
        super().__init__()
        self.stats = RunningMeanStd(shape)
        self.clip, self.eps = clip, eps

    @torch.no_grad()
    def normalize(self, obs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        std = (self.stats.var + self.eps).sqrt().float()
        out = torch.sub(obs, self.stats.mean.float(), out=out)
        return out.div_(std).clamp_(-self.clip, self.clip)


class RewardScaler(nn.Module):
    """Divide rewards by the running std of the discounted return (as SB3's VecNormalize)."""

    ret: torch.Tensor  # a buffer: each row's running discounted return

    def __init__(self, num_rows: int, gamma: float, clip: float, eps: float = 1e-8):
        super().__init__()
        self.stats = RunningMeanStd(())
        self.register_buffer("ret", torch.zeros(num_rows, dtype=torch.float64))
        self.gamma, self.clip, self.eps = gamma, clip, eps

    @torch.no_grad()
    def scale(self, reward: torch.Tensor, done: torch.Tensor, out: torch.Tensor, rows: slice = slice(None)) -> None:
        """Scale the rewards of agent rows ``rows`` (an async batch covers only some)."""
        ret = self.ret[rows]
        ret.mul_(self.gamma).add_(reward)
        self.stats.update(ret)
        ret.masked_fill_(done, 0.0)
        torch.div(reward, (self.stats.var + self.eps).sqrt().float(), out=out).clamp_(-self.clip, self.clip)
