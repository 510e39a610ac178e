"""Per-row episode return and length, summarised RLlib-style (seed 004's summarize_episodes)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class EpisodeTracker:
    """Accumulates raw env rewards per agent row; finished episodes go to a smoothing window.

    Takes a whole rollout at once: a few numpy ops over the block, and Python only for the
    episodes that ended in it (per step, the bookkeeping cost as much as a policy forward).
    """

    def __init__(self, num_rows: int, window: int):
        self.ret = np.zeros(num_rows, dtype=np.float64)
        self.len = np.zeros(num_rows, dtype=np.int64)
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.episodes_total = 0
        self.episodes_this_iter = 0

    def add(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> None:
        """Add ``T`` steps, arrays ``[T, rows]``; ``done`` rows (terminated or truncated, and valid)
        close their episode. Episodes enter the window in the order they ended."""
        # Running sums since the start of the block: an episode ending at step t has its
        # return so far plus cum_ret[t]; the next one starts from -cum_ret[t].
        cum_ret = np.cumsum(reward * valid, axis=0, dtype=np.float64)
        cum_len = np.cumsum(valid, axis=0, dtype=np.int64)
        steps, rows = np.nonzero(done & valid)
        for t, row in zip(steps.tolist(), rows.tolist()):
            self.returns.append(float(self.ret[row] + cum_ret[t, row]))
            self.lengths.append(int(self.len[row] + cum_len[t, row]))
            self.ret[row] = -cum_ret[t, row]
            self.len[row] = -cum_len[t, row]
        self.ret += cum_ret[-1]
        self.len += cum_len[-1]
        self.episodes_this_iter += len(rows)
        self.episodes_total += len(rows)

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
