"""Samplers: which transitions of the ``[N, T]`` storage each minibatch holds.

A learn step never slices time by hand: it asks a sampler for an epoch of minibatches. Which
rows belong to a policy is a mask over the storage (``select``), not a copy made by the caller.
``FlatSampler`` shuffles single transitions; ``SegmentSampler`` views the storage as
``[segments, segment_length]`` with each segment's stored start state (recurrent learning), and
draws whole segments: shuffled, or by priority (with the probability of each drawn segment, from
which the learner weighs it). A minibatch is a TensorDict of its own (a gathered copy, or a shallow
copy of ``data`` when one minibatch covers it all): a learner may replace its fields without
touching the storage or the next epoch's minibatches.
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
        self.padded = "valid" in self.data.keys() and not bool(self.data["valid"].all())  # noqa: SIM118 (a TensorDict)
        """Whether some transitions are padding (``valid`` False), which losses must mask out."""

    def __len__(self) -> int:
        return self.count

    def indices(self) -> Iterator[torch.Tensor | None]:
        """One epoch of index sets into ``data`` (None: all of it, in order)."""
        if self.count == 1:
            yield None
            return
        # drawn on the generator's device (the CPU), then moved to the data
        perm = torch.randperm(self.data.batch_size[0], generator=self.generator).to(self.data.device)
        yield from perm.tensor_split(self.count)

    def __iter__(self) -> Iterator[TensorDict]:
        for index in self.indices():
            yield self.data.copy() if index is None else self.data[index]


class SegmentSampler:
    """Minibatches of whole segments: the ``[N, T]`` transition view ``data`` as ``[N * T / L, L]``
    segments of ``segment_length`` L (each row's fragment cut in order, so a segment never spans two
    rows), with ``start_states`` (a policy's ``[N, T / L]`` state at each segment start) alongside.

    ``select`` (bool ``[N, T]``) keeps the segments holding any selected step and marks the others
    of their steps not ``valid``, so a loss masks them out. An epoch is ``len(self)`` minibatches
    of about ``minibatch_segments`` segments: without priorities a shuffle of all segments split
    into near-equal parts, as ``FlatSampler`` does with transitions; with them (``epoch(priority,
    alpha)``) each minibatch draws segments with replacement, with probability p_i proportional
    to ``priority_i ** alpha``, and yields each drawn segment's p_i, from which the learner
    computes its importance weight. ``alpha=0`` is the shuffle.
    """

    def __init__(
        self,
        data: TensorDict,
        segment_length: int,
        minibatch_segments: int,
        generator: torch.Generator | None = None,
        select: torch.Tensor | None = None,
        start_states: TensorDict | None = None,
    ):
        n, t = data.batch_size
        if t % segment_length:
            raise ValueError(f"segment_length={segment_length} must divide the {t} steps of each row")
        shape = (n * t // segment_length, segment_length)
        # A view of contiguous data (the learner's own gathered copy), else a copy; either way only
        # new keys and the boolean-indexed copy below are written, never the caller's tensors.
        segments = data.reshape(*shape)
        states = None if start_states is None else start_states.reshape(-1)
        if select is not None:
            steps = select.reshape(shape)
            keep = steps.any(1)
            segments = segments[keep]
            segments["valid"] &= steps[keep]
            states = None if states is None else states[keep]
        self.data, self.start_states, self.generator = segments, states, generator
        self.count = num_minibatches(segments.batch_size[0], minibatch_segments)
        self.padded = not bool(segments["valid"].all())
        """Whether some steps are padding (``valid`` False), which losses must mask out."""

    def __len__(self) -> int:
        return self.count

    def epoch(
        self, priority: torch.Tensor | None = None, alpha: float = 0.0
    ) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """One epoch of ``(index, probability)``: segment indices into ``data`` (None: all of them,
        in order) and the probability with which each was drawn (None without priorities).
        ``priority`` is one non-negative number per segment."""
        total = self.data.batch_size[0]
        if priority is None or alpha == 0.0:
            if self.count == 1:
                yield None, None
                return
            perm = torch.randperm(total, generator=self.generator).to(self.data.device)
            for index in perm.tensor_split(self.count):
                yield index, None
            return
        if priority.shape != (total,) or bool((priority < 0).any()) or not bool(priority.isfinite().all()):
            raise ValueError(f"priority must be {total} finite non-negative numbers, one per segment")
        # in logs, so that a large alpha cannot overflow; zero priority: never drawn
        log_weight = alpha * priority.double().log()
        if not bool(log_weight.isfinite().any()):  # no segment stands out: draw uniformly
            log_weight = torch.zeros_like(log_weight)
        prob = log_weight.softmax(0).cpu()  # drawn on the generator's device (the CPU)
        size = -(-total // self.count)  # ceil: an epoch draws at least as many segments as it holds
        for _ in range(self.count):
            index = torch.multinomial(prob, size, replacement=True, generator=self.generator)
            yield index.to(self.data.device), prob[index].to(self.data.device)

    def minibatch(self, index: torch.Tensor | None) -> tuple[TensorDict, TensorDict | None]:
        """The segments ``index`` names, ``[M, L]``, and their start states ``[M]`` (None when none are stored)."""
        if index is None:
            return self.data.copy(), self.start_states
        return self.data[index], None if self.start_states is None else self.start_states[index]
