"""A CPU-bound env whose step takes about 1 ms, for measuring parallel and async rollouts.

The step spins the CPU (holding the GIL, like a physics engine written in Python would) for
``step_ms`` milliseconds. The task is easy to learn: reward 1 when the action matches the sign
of the first observation. Registered with Gymnasium as ``Busy-v0`` when imported, so
``PYTHONPATH=. shoal bench env benchmarks.busy_env:Busy-v0`` finds it.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class BusyEnv(gym.Env):
    def __init__(self, step_ms: float = 1.0, episode_len: int = 100):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_s, self.episode_len = step_ms / 1e3, episode_len
        self.t = 0
        self.obs = np.zeros(4, np.float32)

    def _observe(self) -> np.ndarray:
        self.obs[:] = self.np_random.uniform(-1, 1, 4)
        return self.obs.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        reward = float((self.obs[0] > 0) == (int(action) == 1))
        self.t += 1
        return self._observe(), reward, False, self.t >= self.episode_len, {}


if "Busy-v0" not in gym.registry:
    gym.register("Busy-v0", entry_point=BusyEnv)
