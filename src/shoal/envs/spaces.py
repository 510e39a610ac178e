"""How each Gymnasium space maps onto rows of preallocated tensors.

Observations: Box keeps its shape; Discrete becomes a one-hot float vector; Dict and Tuple are
flattened (gymnasium's flatten order) into one float32 vector. Actions: Discrete -> int64 [A],
MultiDiscrete -> int64 [A, k], Box -> float32 [A, d].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.errors import EnvError


@dataclass(frozen=True)
class ObsSpec:
    space: gym.Space[Any]
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    structured: bool  # Dict/Tuple/Discrete: written through gymnasium's flatten

    def write(self, out: npt.NDArray[Any], obs: Any, env_name: str) -> None:
        """Write one env's observation into the row ``out``, checking its shape."""
        if self.structured:
            try:
                obs = gym.spaces.flatten(self.space, obs)
            except (KeyError, IndexError, TypeError, ValueError, AssertionError) as e:
                raise EnvError(
                    f"env '{env_name}' returned an observation that does not fit its observation_space "
                    f"{self.space}: {e!r}."
                ) from None
        shape = getattr(obs, "shape", None)
        if shape != self.shape:
            obs = np.asarray(obs)
            if obs.shape != self.shape:
                raise EnvError(
                    f"env '{env_name}' returned an observation of shape {obs.shape} and dtype {obs.dtype}; "
                    f"its observation_space {self.space} promises shape {self.shape} and dtype {self.space.dtype}."
                )
        out[...] = obs

    def flat_sample(self) -> npt.NDArray[Any]:
        """One random observation in its stored form (flattened when structured)."""
        obs = self.space.sample()
        return np.asarray(gym.spaces.flatten(self.space, obs) if self.structured else obs, dtype=self.dtype)


def obs_spec(space: gym.Space[Any]) -> ObsSpec:
    if isinstance(space, gym.spaces.Box):
        dtype = np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else np.dtype(space.dtype)
        return ObsSpec(space, tuple(space.shape), dtype, structured=False)
    if isinstance(
        space,
        (gym.spaces.Dict, gym.spaces.Tuple, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary),
    ):
        size = int(gym.spaces.flatdim(space))
        return ObsSpec(space, (size,), np.dtype(np.float32), structured=True)
    raise EnvError(
        f"observation space {space} is not supported: use Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple."
    )


ActionKind = Literal["discrete", "multi_discrete", "continuous"]


@dataclass(frozen=True)
class ActionSpec:
    space: gym.Space[Any]
    kind: ActionKind
    shape: tuple[int, ...]  # per-row shape in the rollout
    dtype: np.dtype[Any]
    nvec: tuple[int, ...] = ()  # category counts (discrete kinds)


def action_spec(space: gym.Space[Any]) -> ActionSpec:
    if isinstance(space, gym.spaces.Discrete):
        if space.start != 0:
            raise EnvError(f"Discrete action space {space} starts at {space.start}; shoal needs start=0.")
        return ActionSpec(space, "discrete", (), np.dtype(np.int64), (int(space.n),))
    if isinstance(space, gym.spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise EnvError(f"MultiDiscrete action space {space} must be 1-D.")
        return ActionSpec(
            space, "multi_discrete", (len(space.nvec),), np.dtype(np.int64), tuple(int(n) for n in space.nvec)
        )
    if isinstance(space, gym.spaces.Box):
        if len(space.shape) != 1:
            raise EnvError(f"Box action space {space} must be 1-D.")
        return ActionSpec(space, "continuous", tuple(space.shape), np.dtype(np.float32))
    raise EnvError(f"action space {space} is not supported: use Discrete, MultiDiscrete or Box.")


@dataclass(frozen=True)
class EnvInfo:
    """What an algorithm knows of the envs it learns from: the row layout of the flat batch."""

    name: str
    """The env's name as logs show it (its id, or its class for an env object)."""
    obs_spec: ObsSpec
    """Shape, dtype and space of one agent's observation as the rollout stores it."""
    act_spec: ActionSpec
    """Shape, dtype and kind of one agent's action."""
    num_envs: int
    """Envs stepped side by side."""
    rows_per_env: int
    """Agent rows per env (1 for single-agent envs; multi-agent envs pad to their most agents)."""
    mask_size: int = 0
    """Width of the action mask, 0 when no env sends one."""
    critic_dim: int = 0
    """Width of a centralized critic's extra input, 0 without one."""
    info_size: int = 0
    """Values of the step infos stored each step (``info_keys``), 0 without them."""
    turn_based: bool = False
    """Agents take turns (PettingZoo AEC games): a row that is not ``valid`` while its agent still
    plays waits for its turn, and its previous decision's successor is its next one."""

    @property
    def num_rows(self) -> int:
        """Rows of the flat agent batch: ``num_envs * rows_per_env``."""
        return self.num_envs * self.rows_per_env
