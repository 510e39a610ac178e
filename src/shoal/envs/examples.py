"""Example envs: many agents on a grid stepped with numpy (``TargetGrid``), a Dict observation
of an image and a vector that are each useless alone (``SideSwitch``), a corridor whose
reward is found only by exploring (``SparseChain``), and a bandit learned only by remembering
what each pull paid (``TwoArmedBandit``).

Importing this module registers them as ``TargetGrid-v0``, ``SideSwitch-v0``, ``SparseChain-v0``
and ``TwoArmedBandit-v0`` (``env_config`` holds their keyword arguments), so ``shoal train
shoal.envs.examples:TargetGrid-v0`` trains one.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.envs.native import AgentEnv
from shoal.envs.registry import register_env

# action -> (dx, dy): stay, up, down, left, right
MOVES = np.array([[0, 0], [0, 1], [0, -1], [-1, 0], [1, 0]], dtype=np.int64)


class TargetGrid(AgentEnv):
    """``num_agents`` agents on a ``size`` x ``size`` grid, each walking to a target of its own.

    Observation (5 floats): the agent's cell and the offset to its target, both divided by
    ``size - 1``, and the fraction of the episode gone. Actions: Discrete(5), stay or one step up,
    down, left or right (the walls stop a move). Reward: 1 for reaching the target, which moves
    to another cell at once, plus 0.1 for each cell the step brought the agent closer (or -0.1
    farther), so the shared policy learns in seconds. Episodes last ``max_steps`` steps for every
    agent together, then are truncated and the env starts over in the same step.
    """

    def __init__(self, num_agents: int = 128, size: int = 8, max_steps: int = 32):
        self.num_agents, self.size, self.max_steps = num_agents, size, max_steps
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
        self.single_action_space = gym.spaces.Discrete(len(MOVES))
        self.rng = np.random.default_rng()
        self.pos = np.zeros((num_agents, 2), np.int64)
        self.target = np.zeros((num_agents, 2), np.int64)
        self.dist = np.zeros(num_agents, np.int64)  # Manhattan distance to the target
        self._before = np.zeros(num_agents, np.int64)
        self.t = 0

    def reset(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._start()
        self.reward[:] = 0.0
        self.terminated[:] = False
        self.truncated[:] = False

    def step(self, actions: npt.NDArray[Any]) -> None:  # [num_agents] int64: Discrete(5)
        self.t += 1
        self.pos += MOVES[actions]
        np.clip(self.pos, 0, self.size - 1, out=self.pos)
        self._before[:] = self.dist
        self._measure()
        reached = self.dist == 0
        np.subtract(self._before, self.dist, out=self.reward, casting="unsafe")
        self.reward *= 0.1
        self.reward += reached
        if reached.any():
            self._new_targets(reached)
        over = self.t >= self.max_steps
        self.truncated[:] = over
        if over:
            self._observe(self.final_obs)
            self._start()
        else:
            self._observe(self.obs)

    def _start(self) -> None:
        """A new episode: every agent on a random cell with a target elsewhere."""
        self.t = 0
        self.pos[:] = self.rng.integers(0, self.size, self.pos.shape)
        self._new_targets(np.ones(self.num_agents, dtype=bool))
        self._observe(self.obs)

    def _new_targets(self, which: npt.NDArray[np.bool_]) -> None:
        """Give the agents in ``which`` a target on a random cell other than their own."""
        cells = self.size * self.size
        here = self.pos[which, 0] * self.size + self.pos[which, 1]
        there = (here + self.rng.integers(1, cells, here.shape)) % cells
        self.target[which, 0], self.target[which, 1] = np.divmod(there, self.size)
        self._measure()

    def _measure(self) -> None:
        np.abs(self.target - self.pos).sum(1, out=self.dist)

    def _observe(self, out: npt.NDArray[np.float32]) -> None:
        scale = 1.0 / (self.size - 1)
        np.multiply(self.pos, scale, out=out[:, 0:2])
        np.multiply(self.target - self.pos, scale, out=out[:, 2:4])
        out[:, 4] = self.t / self.max_steps


class SideSwitch(gym.Env):
    """Dict observations: an image and a vector, each useless alone.

    ``image``: a ``size`` x ``size`` x 1 uint8 picture, black but for one bright cell in its left or
    right half; ``switch``: a one-hot of two settings. The right action (Discrete(4)) is
    ``2 * side + setting``: reward 1 for it, 0 otherwise. Each of the ``length`` steps of an
    episode shows a new picture and switch, so a policy that reads both keys scores ``length``,
    one that reads either alone ``length / 2`` and a random one ``length / 4``.
    """

    def __init__(self, size: int = 12, length: int = 8):
        self.size, self.length = size, length
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (size, size, 1), np.uint8),
                "switch": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(4)
        self.t = self.answer = 0

    def _draw(self) -> dict[str, npt.NDArray[Any]]:
        side, setting = self.np_random.integers(0, 2, 2)
        image = np.zeros((self.size, self.size, 1), np.uint8)
        half = self.size // 2
        image[self.np_random.integers(0, self.size), side * half + self.np_random.integers(0, half), 0] = 255
        self.answer = int(2 * side + setting)
        return {"image": image, "switch": np.eye(2, dtype=np.float32)[setting]}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action: int) -> tuple[dict[str, npt.NDArray[Any]], float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == self.answer)
        self.t += 1
        return self._draw(), reward, False, self.t >= self.length, {}


class SparseChain(gym.Env):
    """A corridor of ``length`` cells, a small reward at one end and a large one at the other.

    The agent starts in cell 1 and steps left or right (Discrete(2)); it sees a one-hot of its
    cell. Stepping into cell 0 ends the episode with reward ``near`` (0.1); reaching the last cell
    ends it with reward 1. Nothing else is rewarded, and an episode is truncated after ``2 *
    length`` steps. A random walk from cell 1 reaches the far end first with probability
    ``1 / (length - 1)``, so a learner soon settles for the near reward unless something (an
    exploration bonus) drives it on.
    """

    def __init__(self, length: int = 20, near: float = 0.1):
        if length < 3:
            raise ValueError(f"SparseChain length={length}: the corridor needs at least 3 cells")
        self.length, self.near, self.limit = length, near, 2 * length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cell = self.t = 0

    def _obs(self) -> npt.NDArray[np.float32]:
        obs = np.zeros(self.length, np.float32)
        obs[self.cell] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.cell, self.t = 1, 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.cell += 1 if int(action) == 1 else -1
        self.t += 1
        far = self.cell == self.length - 1
        reward = 1.0 if far else self.near if self.cell == 0 else 0.0
        return self._obs(), reward, far or self.cell == 0, self.t >= self.limit, {"reached_far_end": float(far)}


class TwoArmedBandit(gym.Env):
    """Two arms, one better, drawn anew at each episode start; the observation is a constant.

    Each of the ``pulls`` steps of an episode pulls an arm (Discrete(2)): the better one pays 1
    with probability ``p_better`` (0.9), the other with ``1 - p_better``. Only the actions taken
    and the rewards they brought tell the arms apart, so a policy that remembers them (a recurrent
    core fed the previous action and reward) earns close to ``p_better`` per pull, and any other
    earns 0.5.
    """

    def __init__(self, pulls: int = 20, p_better: float = 0.9):
        self.pulls, self.p_better = pulls, p_better
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.better = self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.better, self.t = int(self.np_random.integers(0, 2)), 0
        return np.ones(1, np.float32), {}

    def step(self, action: int) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.t += 1
        chance = self.p_better if int(action) == self.better else 1.0 - self.p_better
        reward = float(self.np_random.random() < chance)
        return (
            np.ones(1, np.float32),
            reward,
            False,
            self.t >= self.pulls,
            {"better_arm": float(int(action) == self.better)},
        )


register_env("TargetGrid-v0", lambda config: TargetGrid(**config))
register_env("SideSwitch-v0", lambda config: SideSwitch(**config))
register_env("SparseChain-v0", lambda config: SparseChain(**config))
register_env("TwoArmedBandit-v0", lambda config: TwoArmedBandit(**config))
