"""Backends that step many envs and show them as one flat agent batch."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from shoal.envs.aec import AECEnvAdapter
from shoal.envs.atari import is_atari_id, is_minatar_id
from shoal.envs.horizon import EpisodeRules, stepped_as_one_vector, with_rules
from shoal.envs.multi_agent import dict_env_adapter, is_dict_env
from shoal.envs.native import AgentEnv
from shoal.envs.pettingzoo import ParallelEnvAdapter
from shoal.envs.registry import (
    AnyEnv,
    check_env_id,
    env_creator,
    env_name,
    gym_make,
    is_aec_env,
    is_parallel_env,
)
from shoal.errors import ConfigError, EnvError
from shoal.vector.agents import AgentEnvBackend
from shoal.vector.base import StepBatch, VecBackend
from shoal.vector.gym_vector import GymVectorBackend
from shoal.vector.mp import MultiprocessBackend, SerialClass
from shoal.vector.serial import SerialBackend
from shoal.vector.vmas import VmasBackend, is_vmas

__all__ = [
    "AgentEnvBackend",
    "GymVectorBackend",
    "MultiprocessBackend",
    "SerialBackend",
    "StepBatch",
    "VecBackend",
    "VmasBackend",
    "adapted",
    "make_backend",
]


def make_backend(
    env: Any,
    num_envs: int,
    env_config: dict[str, Any] | None = None,
    *,
    vectorization_mode: str | None = None,
    num_workers: int = 0,
    async_factor: int = 1,
    env_state: bool = False,
    evaluation: bool = False,
    first_env_id: int = 0,
    rules: EpisodeRules | None = None,
    info_keys: tuple[str, ...] = (),
    restart_failed_envs: bool = False,
    recreate_failed_workers: bool = False,
) -> VecBackend:
    """Build the backend for ``env``: an id, a registered name, a gym.Env, a factory, a VectorEnv,
    or ``"vmas:<scenario>"`` (``env_config`` goes to ``vmas.make_env`` and the scenario).

    ``num_workers=0`` steps the envs in this process; more spreads them over worker processes.
    ``env_state``: multi-agent envs also write their global ``state()`` (a centralized critic's input).
    ``evaluation``: envs for evaluation, without training-only wrappers (Atari's life-loss terminals).
    ``first_env_id``: the id of the first env, when these envs are a share of a larger set (a Ray
    rollout worker's): envs are made, seeded and reported by their ids in the whole set.
    ``rules``: horizons and ``no_done_at_end`` (``envs/horizon.py``), applied to each env made.
    ``info_keys``: each step's values of these keys of the env's info go to the batch's ``info``
    (single-agent Gymnasium envs made one by one). ``restart_failed_envs``: an env that raises in
    ``step`` is made anew instead (the same envs). ``recreate_failed_workers``: a worker process
    that dies is started anew."""
    env_config = env_config or {}
    name = env_name(env)
    rules = rules if rules is not None and rules.active else None
    if is_vmas(env) or isinstance(env, gym.vector.VectorEnv) or vectorization_mode is not None:
        _refuse_per_env_options(name, vectorization_mode, rules, info_keys, restart_failed_envs)
        return _one_vector(env, num_envs, env_config, name, vectorization_mode, num_workers)
    instance = isinstance(env, (gym.Env, AgentEnv)) or is_parallel_env(env) or is_aec_env(env)
    make = _copies_of(env, name) if instance else env_creator(env, env_config, evaluation)
    if rules is not None:
        make = _under_rules(make, rules, name)
    make, serial_class = adapted(make, name, env_state)
    if (info_keys or restart_failed_envs or recreate_failed_workers) and serial_class is not SerialBackend:
        raise (
            _infos_unsupported(info_keys, name, "a multi-agent env")
            if info_keys
            else _restarts_unsupported(name, "a multi-agent env")
        )
    if info_keys or restart_failed_envs:
        serial_class = functools.partial(
            SerialBackend, info_keys=tuple(info_keys), restart_failed_envs=restart_failed_envs
        )
    if num_workers:
        return MultiprocessBackend(
            make, num_envs, name, num_workers, async_factor, serial_class, recreate_failed_workers
        )
    return serial_class(make, num_envs, name, first_env_id=first_env_id)


def _refuse_per_env_options(
    name: str,
    vectorization_mode: str | None,
    rules: EpisodeRules | None,
    info_keys: tuple[str, ...],
    restart_failed_envs: bool,
) -> None:
    """Horizons, info keys and restarts act on each env made one by one; an env stepped as one
    vector (VMAS, a VectorEnv, ``vectorization_mode``) has no such envs."""
    if rules is not None:
        raise stepped_as_one_vector(
            f"'{name}'" if vectorization_mode is None else f"vectorization_mode='{vectorization_mode}'"
        )
    if info_keys:
        raise _infos_unsupported(info_keys, name, "stepped as one vector")
    if restart_failed_envs:
        raise _restarts_unsupported(name, "stepped as one vector")


def _one_vector(
    env: Any, num_envs: int, env_config: dict[str, Any], name: str, vectorization_mode: str | None, num_workers: int
) -> VecBackend:
    """The backend of envs that step as one batch: a VMAS scenario, a VectorEnv, or a Gymnasium id
    made with ``gym.make_vec``."""
    if is_vmas(env):
        if num_workers or vectorization_mode is not None:
            raise ConfigError(
                f"env '{name}' is a VMAS scenario, which steps all its envs as one batch of tensors "
                f"already; leave num_workers=0 and vectorization_mode unset (got num_workers="
                f"{num_workers}, vectorization_mode={vectorization_mode!r})."
            )
        return VmasBackend(env.removeprefix("vmas:"), num_envs, env_config)
    if isinstance(env, gym.vector.VectorEnv):
        if env.num_envs != num_envs:
            raise EnvError(
                f"the vector env '{name}' holds {env.num_envs} envs but num_envs={num_envs}; "
                f"set num_envs={env.num_envs}."
            )
        return GymVectorBackend(env, name)
    if not isinstance(env, str):
        raise EnvError(f"vectorization_mode='{vectorization_mode}' needs a Gymnasium env id, got {name}.")
    if is_atari_id(env) or is_minatar_id(env):
        raise ConfigError(
            f"vectorization_mode='{vectorization_mode}' would make '{name}' without shoal's wrappers "
            f"(Atari preprocessing, MinAtar rendering); leave it unset (num_workers steps envs in "
            f"parallel processes)."
        )
    check_env_id(env)
    return GymVectorBackend(
        gym_make(gym.make_vec, env, env_config, num_envs=num_envs, vectorization_mode=vectorization_mode), name
    )


def adapted(
    make: Callable[[int], AnyEnv], name: str, env_state: bool = False
) -> tuple[Callable[[int], Any], SerialClass]:
    """Multi-agent envs step through an adapter on the agent-env backend (a native env is its own
    adapter); gym envs as they are. The env made to find out which is the one handed out for index 0."""
    first = make(0)
    if isinstance(first, AgentEnv):
        if first.bound:  # an instance already writing another backend's rows (the trainer's, when evaluating)
            first = copy.deepcopy(first)
        return (lambda index: first if index == 0 else make(index)), AgentEnvBackend
    if is_dict_env(first):
        return (lambda index: dict_env_adapter(first if index == 0 else make(index), name)), AgentEnvBackend
    adapter = AECEnvAdapter if is_aec_env(first) else ParallelEnvAdapter if is_parallel_env(first) else None
    if adapter is None:
        return (lambda index: first if index == 0 else make(index)), SerialBackend
    return (lambda index: adapter(first if index == 0 else make(index), name, env_state)), AgentEnvBackend


def _infos_unsupported(info_keys: tuple[str, ...], name: str, what: str) -> ConfigError:
    return ConfigError(
        f"info_keys={list(info_keys)} reads the step infos of single-agent Gymnasium envs that shoal makes one "
        f"by one (in this process, worker processes or Ray workers); '{name}' is {what}. Numbers in the info of "
        f"an episode's last step become custom metrics without info_keys."
    )


def _restarts_unsupported(name: str, what: str) -> ConfigError:
    return ConfigError(
        f"restart_failed_envs and recreate_failed_workers start failed envs anew, which needs single-agent "
        f"Gymnasium envs that shoal makes one by one; '{name}' is {what}."
    )


def _under_rules(make: Callable[[int], AnyEnv], rules: EpisodeRules, name: str) -> Callable[[int], AnyEnv]:
    return lambda index: with_rules(make(index), rules, name)


def _copies_of(env: AnyEnv, name: str) -> Callable[[int], AnyEnv]:
    """The instance itself for index 0, deep copies for the others (a factory is the better way)."""

    def make(index: int) -> AnyEnv:
        if index == 0:
            return env
        try:
            return copy.deepcopy(env)
        except Exception as e:
            raise EnvError(
                f"cannot copy the env instance '{name}' for num_envs > 1 ({e!r}); pass a factory or an env id."
            ) from None

    return make
