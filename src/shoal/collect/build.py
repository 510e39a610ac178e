"""What a collector is built from, as a run's config asks: which policy acts for each row, the
critic's extra input, the episode counter, reward scaling and clipping, and the collector itself
(local, or gathering the fragments of Ray rollout workers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shoal.collect.collector import Collector
from shoal.collect.critic import CriticInput, EnvState, TeamObs
from shoal.collect.episodes import Episode, EpisodeTracker
from shoal.collect.policies import PolicyMap, mapping_function
from shoal.collect.remote import RemoteCollector
from shoal.config import TrainerConfig
from shoal.errors import ConfigError
from shoal.models.normalize import RewardScaler
from shoal.models.policy import Policy
from shoal.vector import VecBackend
from shoal.vector.ray_workers import WorkerSet


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
        assert isinstance(backend, WorkerSet) and tracker is not None  # the driver's: the trainer made it
        return RemoteCollector(backend, policies, tracker, extras)
    reward_scaler = RewardScaler(backend.num_rows, c.gamma, c.clip_reward) if c.normalize_reward else None
    return Collector(backend, policies, tracker, extras, reward_scaler, critic, c.reward_clipping)


def episode_tracker(
    config: TrainerConfig, backend: VecBackend, on_episode_end: Callable[[Episode], None] | None
) -> EpisodeTracker:
    """The run's episode counter over ``backend``'s rows, as the config's metrics ask."""
    c = config
    return EpisodeTracker(
        backend.num_rows,
        c.metrics_num_episodes_for_smoothing,
        backend.batch.env_id.numpy(),
        on_episode_end,
        backend.agents,
        c.policy_ids,
        c.info_keys,
        drop_failed=c.restart_failed_envs or c.recreate_failed_workers,
    )


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


def policy_map(policies: dict[str, Policy], backend: VecBackend, mapping_fn: Any) -> PolicyMap:
    """Which of ``policies`` acts for each of ``backend``'s rows."""
    agents = backend.agents or [f"agent_{i}" for i in range(backend.rows_per_env)]  # anonymous rows
    mapping = mapping_function(mapping_fn, list(policies), agents) if len(policies) > 1 else None
    return PolicyMap(policies, mapping, agents, backend.num_envs)
