"""Envs that need memory: what the agent must know is not in its current observation.

Each ``<Env>NoVel`` id is a standard env observing its positions and angles but not their rates of
change, which a recurrent policy must infer from successive observations:

| id | of | observes |
|---|---|---|
| ``CartPoleNoVel-v1`` | ``CartPole-v1`` | cart position, pole angle |
| ``PendulumNoVel-v1`` | ``Pendulum-v1`` | cos and sin of the angle |
| ``MountainCarContinuousNoVel-v0`` | ``MountainCarContinuous-v0`` | position |
| ``LunarLanderNoVel-v3`` | ``LunarLander-v3`` | x, y, angle, leg contacts |

The velocities left out are what control needs, so a feedforward policy stays far below what a
recurrent one reaches (on CartPoleNoVel-v1 about 45 against 500). Importing ``shoal`` registers
the ids with Gymnasium (``gym.make("PendulumNoVel-v1")``); each takes the full env's keyword
arguments.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

NO_VELOCITY = {
    # id: (the full env, the observation entries kept)
    "CartPoleNoVel-v1": ("CartPole-v1", [0, 2]),  # of (x, x_dot, theta, theta_dot)
    "PendulumNoVel-v1": ("Pendulum-v1", [0, 1]),  # of (cos, sin, theta_dot)
    "MountainCarContinuousNoVel-v0": ("MountainCarContinuous-v0", [0]),  # of (position, velocity)
    "LunarLanderNoVel-v3": ("LunarLander-v3", [0, 1, 4, 6, 7]),  # of (x, y, vx, vy, angle, omega, leg, leg)
}


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


def no_velocity(full_id: str, keep: list[int], **kwargs: Any) -> gym.Env[npt.NDArray[np.float32], Any]:
    """``full_id`` (with its time limit) observing only the entries ``keep``."""
    return PositionsOnly(gym.make(full_id, **kwargs), keep)


def register() -> None:
    for env_id, (full_id, keep) in NO_VELOCITY.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=functools.partial(no_velocity, full_id, keep))
