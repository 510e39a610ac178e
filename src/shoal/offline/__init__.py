"""Offline experience: datasets in Minari's layout written as the envs are stepped (``output``), read
in place of the envs by the replay learners (``input``), and what the trainer needs to build both."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal import distributed
from shoal.errors import ConfigError
from shoal.offline.minari_files import DatasetError, DatasetFile, EpisodeArrays, dataset_folders
from shoal.offline.no_env import recorded_env, recorded_name
from shoal.offline.reader import DatasetReader, dataset_inputs, open_source
from shoal.offline.writer import DatasetWriter, WriterSettings, stored_spaces

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from shoal.config import TrainerConfig
    from shoal.envs.spaces import EnvInfo

__all__ = [
    "DatasetError",
    "DatasetFile",
    "DatasetReader",
    "DatasetWriter",
    "EpisodeArrays",
    "dataset_folders",
    "dataset_reader",
    "dataset_writer",
    "recorded_env",
    "recorded_name",
]


def dataset_writer(
    config: TrainerConfig,
    env: EnvInfo,
    algo_name: str,
    written: list[str],
    env_spec: str | None,
    env_actions: Callable[[torch.Tensor], torch.Tensor],
    *,
    max_episodes: int | None = None,
    deterministic: bool = False,
) -> DatasetWriter | None:
    """The writer ``output`` asks for (None without it): the steps of the ``written`` policies (the
    trained ones, in training), each policy's datasets in a folder of its own, with the actions as
    ``env_actions`` turns them into the env's; ``max_episodes`` and ``deterministic`` as
    ``WriterSettings`` has them (a recording)."""
    if config.output is None:
        return None
    try:
        import h5py  # noqa: F401  # the writer process needs it: say so before training starts
    except ImportError:
        raise DatasetError(f"output={config.output!r} writes HDF5 datasets: pip install 'shoal[offline]'.") from None
    obs_space, act_space = stored_spaces(env)
    metadata: dict[str, Any] = {"algorithm_name": f"shoal {algo_name}", "shoal_env": env.name}
    if env_spec is not None:
        metadata["env_spec"] = env_spec
    folder = Path(config.output).expanduser()
    if distributed.world_size() > 1:  # each data-parallel rank collects its own steps
        folder = folder / f"rank-{distributed.rank()}"
    settings = WriterSettings(
        folder=folder,
        policy_ids=tuple(config.policy_ids),
        written=tuple(written),
        observation_space=obs_space,
        action_space=act_space,
        info_keys=tuple(config.info_keys),
        max_file_size=config.output_max_file_size,
        metadata=metadata,
        max_episodes=max_episodes,
        deterministic=deterministic,
    )
    return DatasetWriter(settings, env_actions)


def dataset_reader(config: TrainerConfig, env: EnvInfo) -> DatasetReader | None:
    """The reader ``input`` asks for (None for ``input='sampler'``), its datasets opened and checked
    against the env's spaces."""
    if config.input == "sampler":
        if config.NEEDS_DATASET:  # checked here, not in the config: its defaults alone are built without one
            name = type(config).__name__.removesuffix("Config")
            raise ConfigError(
                f"{name} learns from recorded steps only: set input to a dataset folder (e.g. input=data/)."
            )
        return None
    ids = config.policy_ids
    if len(ids) > 1:
        raise DatasetError(
            f"input={config.input!r}: reading datasets trains one policy; this config has {len(ids)} ({ids})."
        )
    inputs = dataset_inputs(config.input)
    sources = [open_source(Path(path), weight, env, ids[0]) for path, weight in inputs.items()]
    gamma = config.policy_config(ids[0]).gamma  # a per-policy key: MARWIL's returns to go discount by it
    return DatasetReader(sources, env, config.seed, gamma, config.normalize_actions, config.reward_clipping)


class OffPolicyEstimator:
    """``off_policy_estimation_methods`` for one policy: the dataset read once, the estimates made
    at each call (``shoal.offline.estimation``)."""

    def __init__(self, config: TrainerConfig, env: EnvInfo):
        from shoal.offline.estimation import check_methods, load_logged

        if env.act_spec.kind != "discrete":
            raise DatasetError(
                f"off_policy_estimation_methods need Discrete actions (the probability of every action); env "
                f"'{env.name}' has {env.act_spec.space}."
            )
        if len(config.policy_ids) > 1:
            raise DatasetError("off_policy_estimation_methods estimate one policy; this config has several.")
        if config.recurrent:
            raise DatasetError(
                "off_policy_estimation_methods read each recorded step alone, which a recurrent core (model_config "
                "core) cannot; estimate a feedforward policy."
            )
        key = "off_policy_estimation_input" if config.off_policy_estimation_input else "input"
        path = Path(config.off_policy_estimation_input or config.input).expanduser()
        if not path.exists():
            raise DatasetError(f"{key} '{path}' (the episodes off_policy_estimation_methods read) does not exist.")
        source = open_source(path, 1.0, env, config.policy_ids[0])  # the policy's datasets, their spaces checked
        self.config, self.actions = config, env.act_spec.nvec[0]
        self.logged = load_logged(source, config.off_policy_estimation_episodes, env, env.mask_size > 0)
        check_methods(self.logged, list(config.off_policy_estimation_methods))

    def __call__(self, policy: Any) -> dict[str, float]:
        from shoal.offline.estimation import estimate_policy

        c = self.config
        return estimate_policy(
            policy,
            self.logged,
            list(c.off_policy_estimation_methods),
            gamma=c.gamma,
            deterministic=c.evaluation_deterministic,
            actions=self.actions,
            fqe=dict(c.off_policy_estimation_config),
            seed=c.seed,
        )
