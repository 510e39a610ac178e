"""Samplers: which transitions of the ``[N, T]`` storage each minibatch holds.

A learn step never slices time by hand: it asks a sampler for an epoch of minibatches. Which
rows belong to a policy is a mask over the storage (``select``), not a copy made by the caller.
Recurrent segments and prioritized sampling are further samplers over the same storage.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tensordict import TensorDict


def num_minibatches(total: int, minibatch_size: int) -> int:
    """How many near-equal minibatches ``FlatSampler`` makes of ``total`` transitions."""
    return max(1, round(total / minibatch_size))


class FlatSampler:
    """Shuffled minibatches of single transitions (feedforward PPO's sampler).

    ``data`` is a ``[N, T]`` transition view holding the keys the learner reads; ``select`` (bool
    ``[N, T]``) keeps only some transitions (e.g. the steps one policy took). The kept transitions
    are gathered once into a flat ``[M]`` batch. When ``minibatch_size`` does not divide ``M`` (a
    policy's share of a multi-policy batch varies with the mapping) the nearest number of
    near-equal minibatches is made instead. A single minibatch covering everything is yielded
    as it is, unshuffled: the loss is a mean, so order does not matter and a gather would be waste.
    """

    def __init__(
        self,
        data: TensorDict,
        minibatch_size: int,
        generator: torch.Generator | None = None,
        select: torch.Tensor | None = None,
    ):
        flat = data.reshape(-1)
        self.data = flat if select is None else flat[select.reshape(-1)]
        self.generator = generator
        self.count = num_minibatches(self.data.batch_size[0], minibatch_size)

    def __len__(self) -> int:
        return self.count

    def indices(self) -> Iterator[torch.Tensor | None]:
        """One epoch of index sets into ``data`` (None: all of it, in order)."""
        if self.count == 1:
            yield None
            return
        perm = torch.randperm(self.data.batch_size[0], generator=self.generator, device=self.data.device)
        yield from perm.tensor_split(self.count)

    def __iter__(self) -> Iterator[TensorDict]:
        for index in self.indices():
            yield self.data if index is None else self.data[index]
