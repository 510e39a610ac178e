"""Learning from datasets with no env to step: a run given ``input`` and no ``env`` takes the env its
datasets were recorded on when this machine has it (its evaluations play that env), and otherwise
runs with no env at all (``env=None``): the spaces come from the datasets, and no episode is played.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import EnvError
from shoal.offline.minari_files import DatasetError, DatasetFile, dataset_folders
from shoal.offline.reader import dataset_inputs
from shoal.vector.base import Seed, VecBackend

if TYPE_CHECKING:
    import torch

    from shoal.config import TrainerConfig
    from shoal.vector.base import StepBatch


def first_dataset(spec: Any) -> DatasetFile:
    """The first dataset ``input`` names (a folder, a list of them, or folders with weights)."""
    path = Path(next(iter(dataset_inputs(spec))))
    if not path.exists():
        raise DatasetError(f"input '{path}' does not exist.")
    folders = dataset_folders(path)
    if not folders:
        raise DatasetError(f"input '{path}' holds no dataset (no data/metadata.json under it).")
    return DatasetFile.open(folders[0])


def recorded_env(spec: Any) -> str | None:
    """The Gymnasium id ``input``'s datasets were recorded on, when it is registered here (None:
    they name none, or this machine does not have it)."""
    file = first_dataset(spec)
    env_spec = file.metadata.get("env_spec")
    try:
        env_id = json.loads(env_spec)["id"] if isinstance(env_spec, str) else None
    except (ValueError, KeyError, TypeError):
        env_id = None
    return env_id if isinstance(env_id, str) and env_id in gym.registry else None


def recorded_name(spec: Any) -> str:
    """A name for a run with no env: the env the datasets say they came from, else their folder's."""
    file = first_dataset(spec)
    name = file.metadata.get("shoal_env") or file.metadata.get("dataset_id") or file.folder.name
    return str(name)


class RecordedSpaces(VecBackend):
    """The backend of a run with no env: the datasets' spaces and nothing to step (the dataset
    reader fills the rollouts, so only the spaces and the flat batch's shape are read)."""

    def reset(self, seed: Seed = None) -> None:
        """Nothing to start."""

    def _snapshot_envs(self) -> list[Any]:
        return []  # no env state: a checkpoint holds all there is

    def _snapshot_buffers(self) -> dict[str, Any]:
        return {}

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        raise EnvError(
            f"this run has no env to step: it learns from datasets recorded on '{self.name}' (input) and was given "
            f"no env. Give env=... to act in one."
        )


def recorded_spaces(config: TrainerConfig) -> RecordedSpaces:
    """``num_envs`` rows with the spaces of the first of ``input``'s datasets (the reader checks
    that the others share them)."""
    file = first_dataset(config.input)
    return RecordedSpaces(
        recorded_name(config.input), config.num_envs, obs_spec(file.observation_space), action_spec(file.action_space)
    )
