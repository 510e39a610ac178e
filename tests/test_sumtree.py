"""The prioritized-replay segment tree: every node against a tree rebuilt from scratch by a slow loop,
``find`` against numpy's cumsum and searchsorted, stratified sampling against the priorities by a
chi-square test, bad input, and a checkpoint round trip."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shoal.buffers.sumtree import SegmentTree

CAPACITIES = [1, 5, 64, 1000]


def reference_nodes(leaves: list[float], reduce: str) -> list[float]:
    """The whole tree rebuilt from its leaves, one node at a time, in the same left-right order."""
    size = 1
    while size < len(leaves):
        size *= 2
    neutral = 0.0 if reduce == "sum" else math.inf
    nodes = [neutral] * (2 * size)
    nodes[size : size + len(leaves)] = leaves
    for node in range(size - 1, 0, -1):
        left, right = nodes[2 * node], nodes[2 * node + 1]
        nodes[node] = left + right if reduce == "sum" else min(left, right)
    return nodes


def reference_find(priority: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The leaf whose prefix-sum interval holds each mass."""
    return np.searchsorted(np.cumsum(priority), mass, side="right")


def integer_priorities(capacity: int, seed: int) -> np.ndarray:
    """Small integers, half of them 0: every prefix sum is exact in float64, so the tree and numpy
    agree bit for bit, and zero leaves sit at every kind of position."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 5, capacity) * (rng.random(capacity) < 0.5)).astype(np.float64)


def filled(priority: np.ndarray) -> SegmentTree:
    tree = SegmentTree(len(priority))
    tree.update(torch.arange(len(priority)), torch.from_numpy(priority))
    return tree


# ----- updates --------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["sum", "min"])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_every_node_equals_a_tree_rebuilt_from_scratch(capacity: int, reduce: str) -> None:
    rng = np.random.default_rng(capacity)
    tree = SegmentTree(capacity, reduce)
    leaves = [0.0 if reduce == "sum" else math.inf] * capacity
    for batch in [1, 7, 64, 300]:
        # indices from a range smaller than the batch: duplicates in every batch but the first
        index = rng.integers(0, min(capacity, max(1, batch // 2)), batch)
        value = rng.random(batch) * 10 - (0 if reduce == "sum" else 5)
        for i, v in zip(index.tolist(), value.tolist()):  # applied in order: the last one wins
            leaves[i] = v
        tree.update(torch.from_numpy(index), torch.from_numpy(value))
        nodes = reference_nodes(leaves, reduce)
        assert tree.tree[1:].tolist() == nodes[1:]
        assert tree[torch.arange(capacity)].tolist() == leaves
        expected = math.fsum(leaves) if reduce == "sum" else min(leaves)
        assert tree.total() == pytest.approx(expected, rel=1e-12)


def test_a_scalar_value_sets_every_named_leaf_and_any_float_dtype_is_read() -> None:
    tree = SegmentTree(5)
    tree.update(torch.tensor([0, 3, 3]), 2.0)
    tree.update(torch.tensor([4]), torch.tensor([0.5], dtype=torch.float16))
    assert tree[torch.arange(5)].tolist() == [2.0, 0.0, 0.0, 2.0, 0.5]
    assert tree[torch.arange(5)].dtype == torch.float64
    assert tree.total() == 4.5
    assert SegmentTree(5, "min").total() == math.inf  # no leaf set yet


# ----- find -----------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [5, 64, 1000])
def test_find_equals_cumsum_and_searchsorted(capacity: int) -> None:
    priority = integer_priorities(capacity, seed=capacity)
    priority[-1] = 0.0  # a zero leaf last, where masses near the total would fall off the end
    priority[0] = max(priority[0], 1.0)
    tree = filled(priority)
    total = priority.sum()
    prefix = np.cumsum(priority)
    rng = np.random.default_rng(0)
    mass = np.concatenate(
        [
            rng.random(10_000) * total,
            [0.0, np.nextafter(total, 0.0)],
            prefix[prefix < total],  # exact boundaries: belong to the next positive leaf
        ]
    )
    found = tree.find(torch.from_numpy(mass)).numpy()
    np.testing.assert_array_equal(found, reference_find(priority, mass))
    assert (priority[found] > 0).all()


@pytest.mark.parametrize("capacity", [1, 5, 64, 1000])
def test_find_never_returns_a_zero_leaf_at_the_float_edges(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    priority = rng.random(capacity) * (rng.random(capacity) < 0.3)  # inexact sums, mostly zeros
    priority[rng.integers(capacity)] = 0.7
    tree = filled(priority)
    prefix = np.cumsum(priority)
    edges = np.concatenate([prefix, [0.0, tree.total(), tree.total() * (1 + 1e-12), -1e-300]])
    mass = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
    found = tree.find(torch.from_numpy(mass)).numpy()
    assert (priority[found] > 0).all(), mass[priority[found] == 0]
    # at the total and past it: the last positive leaf
    assert tree.find(torch.tensor([tree.total()])).item() == np.flatnonzero(priority)[-1]


@given(st.lists(st.integers(0, 5), min_size=1, max_size=70), st.lists(st.integers(0, 1023), min_size=1))
def test_find_equals_the_reference_for_any_priorities(priority_list: list[int], steps: list[int]) -> None:
    """Masses on a grid of 1/1024 of the total: exact in float64, and often on a boundary."""
    priority = np.array(priority_list, dtype=np.float64)
    if priority.sum() == 0:
        priority[-1] = 1.0
    mass = np.array(steps, dtype=np.float64) / 1024 * priority.sum()
    found = filled(priority).find(torch.from_numpy(mass)).numpy()
    np.testing.assert_array_equal(found, reference_find(priority, mass))


# ----- sampling -------------------------------------------------------------------------------


def chi_square(counts: np.ndarray, prob: np.ndarray) -> float:
    expected = counts.sum() * prob
    return float(((counts - expected) ** 2 / expected).sum())


def test_stratified_samples_follow_the_priorities() -> None:
    """200k draws in batches of 250 against p_i / sum p. Stratified draws vary less than
    independent ones, so the statistic of the right distribution sits below its degrees of freedom;
    the threshold is far above them, and the same counts against the uniform distribution exceed it."""
    capacity = 100
    priority = np.random.default_rng(1).uniform(0.1, 2.0, capacity)
    priority[[3, 50, 99]] = 0.0
    tree = filled(priority)
    generator = torch.Generator().manual_seed(2)
    draws = torch.cat([tree.sample(250, generator) for _ in range(800)]).numpy()
    counts = np.bincount(draws, minlength=capacity)
    assert counts[priority == 0].sum() == 0
    positive = priority > 0
    dof = int(positive.sum()) - 1
    threshold = dof + 6 * math.sqrt(2 * dof)
    assert chi_square(counts[positive], priority[positive] / priority.sum()) < threshold
    uniform = np.full(dof + 1, 1 / (dof + 1))
    assert chi_square(counts[positive], uniform) > threshold


def test_a_batch_holds_one_draw_per_stratum() -> None:
    tree = filled(np.ones(8))
    assert sorted(tree.sample(8, torch.Generator().manual_seed(0)).tolist()) == list(range(8))


# ----- bad input ------------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_bad_value_named() -> None:
    tree = SegmentTree(5)
    with pytest.raises(IndexError, match=r"index 7 is outside \[0, 5\)"):
        tree.update(torch.tensor([0, 7]), torch.tensor([1.0, 1.0]))
    with pytest.raises(IndexError, match=r"index -1 is outside \[0, 5\)"):
        tree[torch.tensor([-1])]
    with pytest.raises(ValueError, match=r"value -0.5 must be finite and non-negative"):
        tree.update(torch.tensor([1, 2]), torch.tensor([1.0, -0.5]))
    with pytest.raises(ValueError, match=r"value nan must be finite"):
        tree.update(torch.tensor([1]), torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match=r"value inf must be finite"):
        tree.update(torch.tensor([1]), float("inf"))
    assert tree.total() == 0.0  # a refused update changes nothing
    with pytest.raises(ValueError, match=r"value nan must be a number"):
        SegmentTree(5, "min").update(torch.tensor([1]), float("nan"))
    with pytest.raises(ValueError, match=r"mass nan must be finite"):
        filled(np.ones(5)).find(torch.tensor([0.5, float("nan")]))
    with pytest.raises(ValueError, match=r"nothing to sample: the total priority is 0.0"):
        tree.sample(4)
    with pytest.raises(ValueError, match=r"find needs a sum tree, not reduce='min'"):
        SegmentTree(5, "min").find(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"reduce='max' must be one of"):
        SegmentTree(5, "max")
    with pytest.raises(ValueError, match=r"capacity=0 must be at least 1"):
        SegmentTree(0)


# ----- checkpoints ----------------------------------------------------------------------------


def test_state_dict_round_trip() -> None:
    tree = filled(np.random.default_rng(0).random(1000))
    buffer = io.BytesIO()
    torch.save(tree.state_dict(), buffer)
    buffer.seek(0)
    restored = SegmentTree(1000)
    restored.load_state_dict(torch.load(buffer))
    assert torch.equal(restored.tree, tree.tree)
    draw = tree.sample(64, torch.Generator().manual_seed(3))
    assert torch.equal(restored.sample(64, torch.Generator().manual_seed(3)), draw)
    with pytest.raises(ValueError, match=r"a tree of capacity 1000 cannot load into capacity 600"):
        SegmentTree(600).load_state_dict(tree.state_dict())
