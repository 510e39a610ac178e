"""What a trainer builds before its first iteration, besides the algorithm: the envs' backend, the
description of them an algorithm builds its networks for, the critic's extra input, which policy
acts for each row, seeds and the run directory."""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.collect import Collector, EpisodeTracker
from shoal.collect.critic import CriticInput, EnvState, TeamObs
from shoal.collect.policies import PolicyMap, mapping_function
from shoal.config import TrainerConfig
from shoal.envs.atari import is_atari_id
from shoal.envs.registry import env_name
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.normalize import RewardScaler
from shoal.models.policy import Policy
from shoal.vector import VecBackend, make_backend
from shoal.vector.external import ExternalBackend


def build_backend(
    config: TrainerConfig, num_envs: int, num_workers: int = 0, evaluation: bool = False, first_env_id: int = 0
) -> VecBackend:
    """Envs that step on this machine: in this process, or in ``num_workers`` worker processes
    (a Ray rollout worker's config asking for ``remote_worker_envs``: each env a Ray actor)."""
    c = config
    if c.remote_worker_envs and c.backend == "local" and not evaluation:
        from shoal.train.remote_envs import RemoteEnvBackend  # only inside a Ray rollout worker

        return with_action_rules(RemoteEnvBackend(c, num_envs, first_env_id), c)
    backend = make_backend(
        c.env,
        num_envs,
        c.env_config,
        c.vectorization_mode,
        num_workers,
        c.async_factor if num_workers else 1,
        env_state=c.central_critic == "state",
        evaluation=evaluation,
        first_env_id=first_env_id,
        rules=c.episode_rules,
        info_keys=() if evaluation else tuple(c.info_keys),
        restart_failed_envs=c.restart_failed_envs and not evaluation,
        recreate_failed_workers=c.recreate_failed_workers and not evaluation,
    )
    return with_action_rules(backend, c)


def with_action_rules(backend: VecBackend, config: TrainerConfig) -> VecBackend:
    """``backend`` turning the policies' Box actions into the env's as ``config`` says; a backend
    refusing the rules is closed."""
    try:
        backend.configure_actions(config.clip_actions, config.normalize_actions)
    except BaseException:
        backend.close()
        raise
    return backend


def training_backend(config: TrainerConfig) -> VecBackend:
    """The envs a run trains on: local ones, those of its Ray rollout workers (``backend='ray'``), or
    the slots external simulators call into (``backend='external'``: the env only names the spaces)."""
    if config.backend == "external":
        probe = build_backend(config, 1)
        try:
            if probe.rows_per_env != 1:
                raise ConfigError(
                    f"backend='external' serves single-agent envs; '{env_name(config.env)}' has several agents."
                )
            external = ExternalBackend(
                probe.name,
                config.num_envs,
                probe.obs_spec,
                probe.act_spec,
                config.async_factor,
                config.client_timeout_s,
            )
            return with_action_rules(external, config)
        finally:
            probe.close()
    if config.backend == "ray":
        from shoal.train.ray_workers import WorkerSet  # Ray is imported only when asked for

        return with_action_rules(WorkerSet(config), config)
    return build_backend(config, config.num_envs, config.num_workers)


def collector(
    config: TrainerConfig,
    backend: VecBackend,
    policies: PolicyMap,
    tracker: EpisodeTracker | None,
    extras: tuple[str, ...],
    critic: CriticInput | None,
) -> Collector:
    """The collector over ``backend``, with the config's reward scaling and clipping; over Ray
    rollout workers, the one that gathers their fragments (each worker scales its own rewards)."""
    c = config
    if c.backend == "ray":
        from shoal.train.ray_workers import RemoteCollector, WorkerSet

        assert isinstance(backend, WorkerSet) and tracker is not None  # the driver's: training_backend made it
        return RemoteCollector(backend, policies, tracker, extras)
    reward_scaler = RewardScaler(backend.num_rows, c.gamma, c.clip_reward) if c.normalize_reward else None
    clip_rewards = is_atari_id(c.env) if c.clip_rewards is None else c.clip_rewards
    return Collector(backend, policies, tracker, extras, reward_scaler, critic, clip_rewards)


def central_critic(kind: str | None, backend: VecBackend, env_name: str) -> CriticInput | None:
    """The extra input ``central_critic=kind`` gives the value function, or None."""
    if kind is None:
        return None
    state = backend.batch.state
    if backend.rows_per_env < 2 or (kind == "state" and state is None):
        why = (
            "has one agent per env"
            if backend.rows_per_env < 2
            else "gives no global state (PettingZoo envs with state() do); try central_critic='team_obs'"
        )
        raise ConfigError(f"central_critic='{kind}' needs a multi-agent env; '{env_name}' {why}.")
    if kind == "state" and state is not None:
        return EnvState(state.shape[1], backend.rows_per_env)
    return TeamObs(int(np.prod(backend.obs_spec.shape)), backend.rows_per_env)


def env_info(backend: VecBackend, env_name: str, critic: CriticInput | None) -> EnvInfo:
    """What an algorithm builds its policies and storage for."""
    mask = backend.batch.action_mask
    return EnvInfo(
        env_name,
        backend.obs_spec,
        backend.act_spec,
        backend.num_envs,
        backend.rows_per_env,
        0 if mask is None else mask.shape[1],
        critic.dim if critic else 0,
        0 if backend.batch.info is None else backend.batch.info.shape[1],
    )


def policy_map(policies: dict[str, Policy], backend: VecBackend, mapping_fn: Any) -> PolicyMap:
    """Which of ``policies`` acts for each of ``backend``'s rows."""
    agents = backend.agents or [f"agent_{i}" for i in range(backend.rows_per_env)]  # anonymous rows
    mapping = mapping_function(mapping_fn, list(policies), agents) if len(policies) > 1 else None
    return PolicyMap(policies, mapping, agents, backend.num_envs)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_dir(config: TrainerConfig, algo_name: str, env_name: str) -> Path | None:
    """The run's directory (None when it saves nothing). A new name is recorded in the config, so
    a checkpoint knows where its run logs."""
    c = config
    if not c.save_outputs:
        return None
    if not c.run_dir:
        name = c.name or f"{algo_name}_{env_name}_seed{c.seed}_{datetime.now():%Y%m%d-%H%M%S}"
        c.run_dir = str(Path("runs") / name.replace("/", "_"))
    return Path(c.run_dir)
