"""Per-row episode return and length, summarised RLlib-style (seed 004's summarize_episodes).

Custom metrics: every numeric scalar an env puts in the ``info`` of an episode's last step (and
anything an ``on_episode_end`` callback adds to ``episode.custom_metrics``) is aggregated over the
same smoothing window as the returns, as ``custom_metrics/<name>_mean/min/max``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np


@dataclass
class Episode:
    """A finished episode, as ``on_episode_end`` callbacks see it."""

    row: int
    env_id: int
    episode_reward: float
    episode_length: int
    info: dict[str, Any]
    custom_metrics: dict[str, float] = field(default_factory=dict)


def numeric_items(info: dict[str, Any]) -> dict[str, float]:
    """The scalar numbers (bools included, e.g. ``is_success``) among an info dict's entries."""
    out = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, (Real, np.bool_)):
            out[key] = float(value)
    return out


class EpisodeTracker:
    """Accumulates raw env rewards per agent row; finished episodes go to a smoothing window.

    Works on the backend's numpy views in place; Python touches only rows whose episode ended.
    """

    def __init__(self, num_rows: int, window: int, env_id: np.ndarray | None = None,
                 on_episode_end: Callable[[Episode], None] | None = None):
        self.ret = np.zeros(num_rows, dtype=np.float64)
        self.len = np.zeros(num_rows, dtype=np.int64)
        self._done = np.zeros(num_rows, dtype=bool)
        self._reward = np.zeros(num_rows, dtype=np.float64)
        self.window = window
        self.env_id = np.arange(num_rows) if env_id is None else env_id
        self.on_episode_end = on_episode_end
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.custom: dict[str, deque[float]] = {}
        self.episodes_total = 0
        self.episodes_this_iter = 0

    def step(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray,
             final_infos: dict[int, dict] | None = None) -> None:
        """Add one step; ``done`` rows (terminated or truncated, and valid) close their episode.
        ``final_infos`` maps rows that ended this step to the info of their last step."""
        np.multiply(reward, valid, out=self._reward)
        self.ret += self._reward
        self.len += valid
        np.logical_and(done, valid, out=self._done)
        if self._done.any():
            rows = np.flatnonzero(self._done)
            self.returns.extend(self.ret[rows].tolist())
            self.lengths.extend(self.len[rows].tolist())
            if final_infos or self.on_episode_end is not None:
                for row in rows.tolist():
                    self._close(row, (final_infos or {}).get(row, {}))
            self.episodes_this_iter += len(rows)
            self.episodes_total += len(rows)
            self.ret[rows] = 0.0
            self.len[rows] = 0

    def _close(self, row: int, info: dict[str, Any]) -> None:
        episode = Episode(row, int(self.env_id[row]), float(self.ret[row]), int(self.len[row]), info,
                          numeric_items(info))
        if self.on_episode_end is not None:
            self.on_episode_end(episode)
        for name, value in episode.custom_metrics.items():
            self.custom.setdefault(name, deque(maxlen=self.window)).append(float(value))

    def summarize(self) -> dict[str, Any]:
        """Stats over the last ``window`` episodes; nan before the first one ends."""
        r = self.returns
        out: dict[str, Any] = {
            "episode_reward_mean": sum(r) / len(r) if r else math.nan,
            "episode_reward_min": min(r) if r else math.nan,
            "episode_reward_max": max(r) if r else math.nan,
            "episode_len_mean": sum(self.lengths) / len(self.lengths) if r else math.nan,
            "episodes_this_iter": self.episodes_this_iter,
            "episodes_total": self.episodes_total,
        }
        if self.custom:
            out["custom_metrics"] = {f"{name}_{stat}": fn(values) for name, values in sorted(self.custom.items())
                                     for stat, fn in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max))}
        self.episodes_this_iter = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ret": self.ret.tolist(), "len": self.len.tolist(), "returns": list(self.returns),
                "lengths": list(self.lengths), "custom": {k: list(v) for k, v in self.custom.items()},
                "episodes_total": self.episodes_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ret[:] = state["ret"]
        self.len[:] = state["len"]
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.lengths.clear()
        self.lengths.extend(state["lengths"])
        self.custom = {k: deque(v, maxlen=self.window) for k, v in state["custom"].items()}
        self.episodes_total = state["episodes_total"]
