"""Recorded observations of Dict, Tuple and discrete spaces as the flat float32 vectors shoal's
rollouts hold: Minari stores them per key (HDF5 groups, or dicts and tuples of arrays), and a whole
episode is flattened at once, in the layout ``gymnasium.spaces.flatten`` gives one observation."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
FLAT_SPACES = (gym.spaces.Box,)  # stored as they are; every other observation space is flattened


def is_structured(space: gym.Space[Any]) -> bool:
    return not isinstance(space, FLAT_SPACES)


def read_node(node: Any, space: gym.Space[Any]) -> Any:
    """The arrays under an HDF5 node in the shape of ``space``: a dict for Dict, a tuple for Tuple
    (Minari names its members ``_index_<i>``), else the node's array."""
    if isinstance(space, gym.spaces.Dict):
        return {key: read_node(_member(node, key), sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(read_node(_member(node, f"_index_{i}"), sub) for i, sub in enumerate(space.spaces))
    if not hasattr(node, "shape"):
        raise KeyError(f"a group where {space} stores an array")
    return node[()]


def _member(node: Any, key: str) -> Any:
    member = node.get(key) if hasattr(node, "get") else None
    if member is None:
        raise KeyError(f"no member '{key}'")
    return member


def flatten_steps(space: gym.Space[Any], data: Any) -> Array:
    """``[steps, flatdim(space)]`` float32 rows from an episode's observations of ``space``."""
    if isinstance(space, gym.spaces.Box):
        array = np.asarray(data)
        return array.reshape(len(array), -1).astype(np.float32)
    if isinstance(space, gym.spaces.Discrete):
        index = np.asarray(data, dtype=np.int64).reshape(-1) - int(space.start)
        return np.eye(int(space.n), dtype=np.float32)[index]
    if isinstance(space, gym.spaces.MultiDiscrete):
        values = np.asarray(data, dtype=np.int64).reshape(-1, space.nvec.size) - space.start.reshape(-1)
        sizes = space.nvec.reshape(-1)
        return np.concatenate([np.eye(int(n), dtype=np.float32)[values[:, i]] for i, n in enumerate(sizes)], axis=1)
    if isinstance(space, gym.spaces.MultiBinary):
        array = np.asarray(data)
        return array.reshape(len(array), -1).astype(np.float32)
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([flatten_steps(sub, data[key]) for key, sub in space.spaces.items()], axis=1)
    if isinstance(space, gym.spaces.Tuple):
        return np.concatenate([flatten_steps(sub, part) for sub, part in zip(space.spaces, data, strict=True)], axis=1)
    raise TypeError(f"observation space {space} cannot be stored flat")
