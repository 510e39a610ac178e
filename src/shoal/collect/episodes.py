"""Per-row episode return and length, summarised RLlib-style (seed 004's summarize_episodes)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class EpisodeTracker:
    """Accumulates raw env rewards per agent row; finished episodes go to a smoothing window.

    Works on the backend's numpy views in place; Python touches only rows whose episode ended.
    """

    def __init__(self, num_rows: int, window: int):
        self.ret = np.zeros(num_rows, dtype=np.float64)
        self.len = np.zeros(num_rows, dtype=np.int64)
        self._done = np.zeros(num_rows, dtype=bool)
        self._reward = np.zeros(num_rows, dtype=np.float64)
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.episodes_total = 0
        self.episodes_this_iter = 0

    def step(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> None:
        """Add one step; ``done`` rows (terminated or truncated, and valid) close their episode."""
        np.multiply(reward, valid, out=self._reward)
        self.ret += self._reward
        self.len += valid
        np.logical_and(done, valid, out=self._done)
        if self._done.any():
            rows = np.flatnonzero(self._done)
            self.returns.extend(self.ret[rows].tolist())
            self.lengths.extend(self.len[rows].tolist())
            self.episodes_this_iter += len(rows)
            self.episodes_total += len(rows)
            self.ret[rows] = 0.0
            self.len[rows] = 0

    def summarize(self) -> dict[str, float]:
        """Stats over the last ``window`` episodes; nan before the first one ends."""
        r = self.returns
        out = {
            "episode_reward_mean": sum(r) / len(r) if r else math.nan,
            "episode_reward_min": min(r) if r else math.nan,
            "episode_reward_max": max(r) if r else math.nan,
            "episode_len_mean": sum(self.lengths) / len(self.lengths) if r else math.nan,
            "episodes_this_iter": self.episodes_this_iter,
            "episodes_total": self.episodes_total,
        }
        self.episodes_this_iter = 0
        return out
