"""The body of one Ray rollout worker: its share of the run's envs, a copy of the policies and a
collector over them, sampling a fragment of each rollout for the driver's ``RemoteCollector``
(``shoal.collect.remote``, where the whole exchange is described)."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import torch

from shoal.collect import build
from shoal.collect.collector import Collector
from shoal.collect.remote import WRITTEN, Fragment
from shoal.config import TrainerConfig
from shoal.models.policy import Policy
from shoal.vector.base import Seed, mixed_seed, seed_everything
from shoal.vector.build import build_backend
from shoal.vector.ray_workers import Storage, Weights
from shoal.vector.restarts import EnvRestarts


class RolloutWorker:
    """The body of one Ray actor: envs ``first_env .. first_env + num_envs - 1`` of the run, a copy
    of the policies and a collector over them."""

    def __init__(
        self,
        config: TrainerConfig,
        index: int,
        incarnation: int,
        first_env: int,
        num_envs: int,
        gym_spec: gym.envs.registration.EnvSpec | None = None,
    ):
        """``gym_spec``: the Gymnasium registration of the env id, for ids the driver registered
        itself (a fresh process does not know them)."""
        torch.set_num_threads(config.torch_threads)
        seed_everything(mixed_seed(config.seed, index, incarnation))
        if gym_spec is not None and gym_spec.id not in gym.registry:
            gym.registry[gym_spec.id] = gym_spec
        self.config = config
        self.policies: dict[str, Policy] = {}
        self.collector: Collector | None = None
        self.storage: dict[int, Storage] = {}
        self.restarted: list[tuple[int, str]] = []  # envs made anew since the last fragment
        # An env that fails to build is reported by start() as the env's error: raised here, it
        # would look like the actor dying, which the driver answers with a replacement.
        self.error: Exception | None = None
        try:
            self.backend = build_backend(config, num_envs, first_env_id=first_env)
        except Exception as e:
            self.error = e

    def start(self, policies: dict[str, Policy], extras: tuple[str, ...]) -> None:
        if self.error is not None:
            raise self.error
        c = self.config
        critic = build.central_critic(c.central_critic, self.backend, self.backend.name)
        policy_map = build.policy_map(policies, self.backend, c.policy_mapping_fn)
        self.policies = policies
        self.collector = build.collector(c, self.backend, policy_map, None, extras, critic)
        self.collector.take_restarts = self._take_restarts
        # the trainer's budget, kept here too: a crash loop stops as it happens, not after the fragment
        self.budget = EnvRestarts(c.max_restarts_per_hour, self.backend.name, warn=False)

    def _take_restarts(self, envs: list[tuple[int, str]], workers: list[str]) -> None:
        """Keep the envs made anew for the next fragment (the driver's trainer warns and counts them)."""
        self.restarted.extend(envs)
        self.budget.take(envs, workers)  # (empties both; no workers: the worker's envs step in its process)

    def _collector(self) -> Collector:
        if self.collector is None:
            raise RuntimeError("RolloutWorker.start(policies, extras) must be called first")
        return self.collector

    def reset(self, seed: Seed) -> None:
        self._collector().reset(seed)

    def sample(
        self,
        weights: Weights,
        key: int,
        storage: Storage | None,
        until_done: bool,
        complete_episodes: int | None = None,
    ) -> Fragment:
        """Act with ``weights`` on the next ``T`` steps (``storage``: the share to fill, sent once per key)."""
        collector = self._collector()
        for pid, (state, attributes) in weights.items():
            policy = self.policies[pid]
            policy.load_state_dict(state)
            for name, value in attributes.items():
                setattr(policy, name, value)
        if storage is not None:
            self.storage[key] = storage
        rollout, start_states = self.storage[key]
        start = time.perf_counter()
        steps = collector.collect(rollout, start_states or None, until_done, complete_episodes)
        seconds = time.perf_counter() - start
        horizon = rollout.batch_size[1] - 1
        truncations = collector.truncations
        assert truncations is not None  # collect() sets them
        raw_reward = collector.raw_reward[:, :horizon]
        written = rollout.select(*(key for key in WRITTEN if key in rollout.keys()), *collector.extras)  # noqa: SIM118
        restarted, self.restarted = self.restarted, []
        return Fragment(
            steps, seconds, (written, start_states), truncations, raw_reward, collector.step_infos, restarted
        )

    def state_dict(self) -> dict[str, Any]:
        return self._collector().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._collector().load_state_dict(state)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.error is None:
            self.backend.close()
