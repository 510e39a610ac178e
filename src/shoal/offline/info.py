"""``shoal dataset info``: what a dataset folder holds, per policy: spaces, shards, episodes, steps and
the statistics of the episodes' returns (read episode by episode, so any size is summarized)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.offline.minari_files import DatasetError, DatasetFile, dataset_folders, owning_policy


def space_label(space: Any) -> str:
    """A space in a few words: ``Box(4,) float32`` (bounds left out), ``Discrete(2)``."""
    if isinstance(space, gym.spaces.Box):
        return f"Box{space.shape} {space.dtype}"
    return str(space)


def dataset_summary(path: Path) -> list[dict[str, Any]]:
    """One row per group of datasets at ``path`` (a run's ``output`` has one per policy)."""
    folders = dataset_folders(path)
    if not folders:
        raise DatasetError(f"'{path}' holds no dataset (no data/metadata.json under it).")
    groups: dict[str, list[DatasetFile]] = {}
    for folder in folders:  # the shards of each policy, over every torchrun rank's folder
        group = owning_policy(path, folder) or "."
        groups.setdefault(group, []).append(DatasetFile.open(folder))
    rows = []
    for group, files in groups.items():
        returns, lengths = [], []
        for file in files:
            for episode in file.episodes():
                returns.append(float(np.sum(episode.rewards, dtype=np.float64)))
                lengths.append(len(episode))
        spaces = {(space_label(f.observation_space), space_label(f.action_space)) for f in files}
        if len(spaces) > 1:
            raise DatasetError(f"the datasets of '{path / group}' disagree on their spaces: {sorted(spaces)}.")
        obs, act = spaces.pop()
        r = np.array(returns if returns else [np.nan])  # no episodes: None (null; 'n/a' in the table)
        stats = {"mean": r.mean(), "std": r.std(), "min": r.min(), "max": r.max()}
        rows.append(
            {
                "policy": group,
                "observation_space": obs,
                "action_space": act,
                "shards": len(files),
                "episodes": len(returns),
                "steps": int(sum(lengths)),
                **{f"return_{k}": float(v) if returns else None for k, v in stats.items()},
                "length_mean": float(np.mean(lengths)) if lengths else None,
            }
        )
    return rows
