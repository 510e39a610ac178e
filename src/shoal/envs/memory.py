"""Envs that need memory: what the agent must know is not in its current observation.

``CartPoleNoVel-v1``: CartPole-v1 observing only the cart position and the pole angle. The
velocities it leaves out are what balancing needs, so a feedforward policy stays far below the
500 a recurrent one reaches by inferring them from successive observations.

Importing ``shoal`` registers the id with Gymnasium (``gym.make("CartPoleNoVel-v1")``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

POSITIONS = [0, 2]  # cart position and pole angle, of (x, x_dot, theta, theta_dot)


class PositionsOnly(gym.ObservationWrapper[npt.NDArray[np.float32], Any, npt.NDArray[np.float32]]):
    """Keep only the entries ``keep`` of a Box observation."""

    def __init__(self, env: gym.Env[npt.NDArray[np.float32], Any], keep: list[int]):
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)  # a Box env is what this wraps
        self.keep = keep
        self.observation_space = gym.spaces.Box(space.low[keep], space.high[keep], dtype=np.float32)

    def observation(self, observation: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return observation[self.keep]


def cartpole_no_velocity(**kwargs: Any) -> gym.Env[npt.NDArray[np.float32], Any]:
    """CartPole-v1 (500-step time limit) observing ``[x, theta]``."""
    return PositionsOnly(gym.make("CartPole-v1", **kwargs), POSITIONS)


def register() -> None:
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register("CartPoleNoVel-v1", entry_point="shoal.envs.memory:cartpole_no_velocity")
