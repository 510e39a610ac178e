"""A segment tree over replay priorities, for prioritized experience replay (Schaul et al. 2015).

Hand-written on torch tensors: no maintained library offers a sum tree that is vectorized over a
batch of torch indices and fits a ``[capacity]`` torch buffer. Vectorized because a replay step
updates and draws hundreds of priorities at once: each operation walks the tree one level at a
time for the whole batch (one gather, one reduce, one scatter per level), so its cost is
``log2(capacity)`` tensor ops, never a Python loop per element.
"""

from __future__ import annotations

import torch

_NEUTRAL = {"sum": 0.0, "min": float("inf")}


class SegmentTree:
    """A complete binary tree over ``capacity`` leaves whose every inner node holds the sum (or min)
    of its two children.

    Storage is one float64 tensor of ``2 * P`` nodes, ``P`` the smallest power of two holding
    ``capacity``: the root at 1, node ``n``'s children at ``2n`` and ``2n + 1``, leaf ``i`` at
    ``P + i`` (node 0 is unused). Leaves past ``capacity`` hold the neutral element (0 for a sum,
    +inf for a min), so they change no reduction. float64 keeps the sums of a million priorities
    exact enough that a drawn mass lands where its prefix sums say.
    """

    def __init__(self, capacity: int, reduce: str = "sum", device: str | torch.device = "cpu"):
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be at least 1")
        if reduce not in _NEUTRAL:
            raise ValueError(f"reduce={reduce!r} must be one of {sorted(_NEUTRAL)}")
        self.capacity, self.reduce = capacity, reduce
        self.leaves = 1 << (capacity - 1).bit_length()
        self.depth = self.leaves.bit_length() - 1  # levels below the root
        self.tree = torch.full((2 * self.leaves,), _NEUTRAL[reduce], dtype=torch.float64, device=device)

    def _check_index(self, index: torch.Tensor) -> torch.Tensor:
        index = torch.as_tensor(index, device=self.tree.device).reshape(-1).long()
        outside = (index < 0) | (index >= self.capacity)
        if bool(outside.any()):
            raise IndexError(f"index {int(index[outside][0])} is outside [0, {self.capacity})")
        return index

    def update(self, index: torch.Tensor, value: torch.Tensor | float) -> None:
        """Set leaves ``index`` ([B]) to ``value`` ([B] or a scalar), then their ancestors.

        A leaf named twice takes its last value, whatever torch's scatter order would be. Nothing
        changes when an index is outside [0, capacity) (IndexError) or a value is NaN, or negative
        or infinite in a sum tree (ValueError).
        """
        index = self._check_index(index)
        value = torch.as_tensor(value, dtype=torch.float64, device=self.tree.device).broadcast_to(index.shape)
        bad = value.isnan()
        if self.reduce == "sum":  # a priority: a draw's weight, which must be a finite share
            bad |= (value < 0) | value.isinf()
        if bool(bad.any()):
            rule = "finite and non-negative in a sum tree" if self.reduce == "sum" else "a number"
            raise ValueError(f"value {float(value[bad][0])} must be {rule}")
        leaf, inverse = torch.unique(index, return_inverse=True)
        position = torch.arange(len(index), device=index.device)
        last = torch.full_like(leaf, -1).scatter_reduce_(0, inverse, position, "amax")
        node = leaf + self.leaves
        self.tree.index_copy_(0, node, value[last])
        pairs = self.tree.view(-1, 2)  # row n: node n's children, 2n and 2n + 1
        for _ in range(self.depth):
            # each parent once, so a level costs at most min(B, its width): a bulk update of every
            # leaf does the work of one pass over the tree; halving keeps them sorted
            node = torch.unique_consecutive(node >> 1)
            children = pairs.index_select(0, node)
            self.tree.index_copy_(0, node, children.sum(1) if self.reduce == "sum" else children.amin(1))

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        """The leaf values at ``index``, float64."""
        return self.tree[self._check_index(index) + self.leaves].reshape(torch.as_tensor(index).shape)

    def total(self) -> float:
        """The root: the sum of all leaves, or their min for a min tree."""
        return float(self.tree[1])

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """For each ``mass`` m in [0, total) the leaf i with prefix_sum(i) <= m < prefix_sum(i + 1).

        Never a zero-priority leaf: the descent enters a right child only when its sum is positive,
        so a mass at or past the total (rounding, or m == total) ends on the last positive leaf, and
        a mass below 0 is read as 0. Since ``a + 0 == a`` exactly, the left child of a positive
        node whose right child is 0 is positive too, so every node on the path is.
        """
        if self.reduce != "sum":
            raise ValueError(f"find needs a sum tree, not reduce={self.reduce!r}")
        if self.total() <= 0:
            raise ValueError(f"find needs a positive total; this tree's total is {self.total()}")
        mass = torch.as_tensor(mass, dtype=torch.float64, device=self.tree.device)
        if not bool(mass.isfinite().all()):
            raise ValueError(f"mass {float(mass[~mass.isfinite()][0])} must be finite")
        remaining = mass.reshape(-1).clamp(min=0.0)
        node = torch.ones_like(remaining, dtype=torch.long)
        pairs = self.tree.view(-1, 2)
        for _ in range(self.depth):
            left_sum, right_sum = pairs.index_select(0, node).unbind(1)
            go_right = (remaining >= left_sum) & (right_sum > 0.0)
            remaining = torch.where(go_right, remaining - left_sum, remaining)
            node = torch.add(go_right, node, alpha=2)  # the chosen child, 2n or 2n + 1
        return (node - self.leaves).reshape(mass.shape)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``batch_size`` leaf indices drawn with probability proportional to their values, stratified
        as in the PER paper: [0, total) cut into ``batch_size`` equal strata, one uniform mass in
        each, so a batch covers the whole range with less variance than independent draws."""
        if self.reduce == "sum" and self.total() <= 0:
            raise ValueError(f"nothing to sample: the total priority is {self.total()}")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        # drawn on the generator's device (the CPU), used on the tree's
        offset = torch.rand(batch_size, generator=generator, dtype=torch.float64).to(self.tree.device)
        strata = torch.arange(batch_size, dtype=torch.float64, device=self.tree.device)
        return self.find((strata + offset) * (self.total() / batch_size))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The nodes and the capacity, as tensors for a checkpoint."""
        return {"tree": self.tree.clone(), "capacity": torch.tensor(self.capacity)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the nodes saved by ``state_dict`` from a tree of the same capacity."""
        if int(state["capacity"]) != self.capacity or state["tree"].shape != self.tree.shape:
            raise ValueError(f"a tree of capacity {int(state['capacity'])} cannot load into capacity {self.capacity}")
        self.tree.copy_(state["tree"])
