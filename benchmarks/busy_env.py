"""Envs whose step takes about 1 ms, for measuring parallel and async rollouts.

``Busy-v0`` is CPU-bound: each step does a fixed amount of work in C (hashing a buffer, standing
in for a physics engine such as MuJoCo), about ``step_ms`` milliseconds on an idle core of the
machine the README's figures come from. The work is fixed, not a wall-clock deadline, so a step
that shares its core takes longer, as real simulation does. (Why not a Python loop: on that
machine the interpreter's speed swung by ±30% from run to run and process to process, while
hashing ran at the same speed every time, alone or two processes at once.)

``Wait-v0`` instead waits ``step_ms`` milliseconds without using the CPU, like an env that talks
to a simulator or game server in another process.

The task is easy to learn: reward 1 when the action matches the sign of the first observation.
Both are registered with Gymnasium when imported, so
``PYTHONPATH=. shoal bench env benchmarks.busy_env:Busy-v0`` finds them.
"""

from __future__ import annotations

import hashlib
import time

import gymnasium as gym
import numpy as np

BYTES_PER_MS = 1_700_000  # SHA-256 throughput per millisecond, measured on that machine


class BusyEnv(gym.Env):
    def __init__(self, step_ms: float = 1.0, episode_len: int = 100, wait: bool = False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_ms, self.episode_len, self.wait = step_ms, episode_len, wait
        self.work = bytes(int(step_ms * BYTES_PER_MS))
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
        if self.wait:
            time.sleep(self.step_ms / 1e3)
        else:
            hashlib.sha256(self.work).digest()
        reward = float((self.obs[0] > 0) == (int(action) == 1))
        self.t += 1
        return self._observe(), reward, False, self.t >= self.episode_len, {}


if "Busy-v0" not in gym.registry:
    gym.register("Busy-v0", entry_point=BusyEnv)
    gym.register("Wait-v0", entry_point=BusyEnv, kwargs={"wait": True})
