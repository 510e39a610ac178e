"""Metric names in the logs, and the end-of-run analysis (RLlib's metric_analysis).

``train()`` returns RLlib's flat keys (``episode_reward_mean``, ``sps``, ``policy_loss``) with
``evaluation`` and ``custom_metrics`` as nested dicts. Every log (JSONL, CSV, TensorBoard,
W&B) stores the same record: counters as they are, everything else under its group, e.g.
``rollout/episode_reward_mean``, ``perf/sps``, ``losses/policy_loss``,
``evaluation/episode_reward_mean``. ``log_key`` is the one mapping; the CLI accepts either name.
"""

from __future__ import annotations

import math
from typing import Any

COUNTERS = ("training_iteration", "timesteps_total", "agent_timesteps_total", "timesteps_this_iter", "time_total_s")
_GROUPS = {
    "rollout": ("episode_", "episodes_"),
    "losses": ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac", "explained_variance"),
    "perf": ("sps", "agent_sps", "time_this_iter_s", "sample_time_ms", "learn_time_ms", "remote_overhead_ms"),
    "workers": ("num_worker_restarts", "num_env_restarts"),
    "learner": ("learning_rate", "num_sgd_"),
}
# Groups where a larger value is better; "best" is reported only where that direction is known.
_HIGHER_IS_BETTER = ("rollout/episode_reward", "evaluation/episode_reward", "custom_metrics/", "perf/sps")


def log_key(key: str) -> str:
    """The logged name of a flat result key (already grouped keys pass through)."""
    if key in COUNTERS or "/" in key:
        return key
    for group, prefixes in _GROUPS.items():
        if key.startswith(prefixes):
            return f"{group}/{key}"
    return f"info/{key}"


def log_record(result: dict[str, Any]) -> dict[str, Any]:
    """The flat, grouped record every writer stores for one ``train()`` result."""
    record: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, dict):
            record.update(_flatten(value, key))
        else:
            record[log_key(key)] = value
    return record


def _flatten(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` under ``prefix`` as ``{"prefix/a/b": 1}``, to any depth."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}/{key}"))
        else:
            flat[f"{prefix}/{key}"] = value
    return flat


class MetricAnalysis:
    """Last, min and max of every numeric metric over a run, and "best" where higher is better."""

    def __init__(self, state: dict[str, dict[str, float]] | None = None):
        self.stats: dict[str, dict[str, float]] = state or {}

    def add(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            s = self.stats.get(key)
            if s is None:
                self.stats[key] = {"last": value, "min": value, "max": value}
            else:
                s["last"], s["min"], s["max"] = value, min(s["min"], value), max(s["max"], value)

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            key: {**s, "best": s["max"]} if key.startswith(_HIGHER_IS_BETTER) else dict(s)
            for key, s in sorted(self.stats.items())
        }
