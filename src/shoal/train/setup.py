"""What a trainer builds before its first iteration: its algorithm's class and settings, its
process's torch settings and seeds, the envs' backend, the description of them the algorithm
builds its networks for, and the run directory. What a Ray rollout worker builds too lives below
the trainer: a config's backend in ``shoal.vector.build``, the collector and what it needs in
``shoal.collect.build``."""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from shoal.algos.base import Algorithm
from shoal.algos.registry import algorithm_class
from shoal.collect.critic import CriticInput
from shoal.collect.rollout_worker import RolloutWorker
from shoal.config import TrainerConfig
from shoal.config.tuned import TunedStart, start_from_tuned
from shoal.envs.registry import PETTINGZOO, config_creator, env_name
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError, shorten, warn
from shoal.models.encoders import is_pixels
from shoal.offline.no_env import recorded_spaces
from shoal.vector import VecBackend
from shoal.vector.base import seed_everything
from shoal.vector.build import build_backend, with_action_rules
from shoal.vector.external import ExternalBackend
from shoal.vector.ray_workers import WorkerSet
from shoal.vector.vmas import is_vmas


def algorithm_settings(
    preset: str | type[Algorithm] | None, trainer_name: str, settings: dict[str, Any]
) -> tuple[type[Algorithm], dict[str, Any], TunedStart]:
    """The algorithm class ``settings`` name, and the settings started from its tuned config for the
    env. ``preset``: the one algorithm the trainer class ``trainer_name`` trains (``shoal.PPO``'s),
    which ``settings`` may name only as itself."""
    default = TrainerConfig.model_fields["algo"].default
    if preset is None:
        algo_cls = algorithm_class(settings.get("algo", default))
    else:
        algo_cls = algorithm_class(preset)
        if "algo" in settings and algorithm_class(settings["algo"]) is not algo_cls:
            raise ConfigError(
                f"shoal.{trainer_name} trains {algo_cls.name}; for algo={shorten(repr(settings['algo']))} use "
                f"shoal.Trainer(algo=...)."
            )
        settings = {**settings, "algo": settings.get("algo", preset)}  # as config.yaml and checkpoints record it
    algo = settings.get("algo", default)
    settings, tuned = start_from_tuned(settings, algo, algo_cls.config_class, lambda: env_kind(settings))
    return algo_cls, settings, tuned


def env_kind(settings: dict[str, Any]) -> str | None:
    """The kind of the env ``settings`` name, which picks its defaults when no tuned config applies:
    ``image`` for pixel observations, else ``box`` for Box actions; None for anything else. An id
    or a factory of a single-agent env is made once and closed at once."""
    env = settings.get("env")
    if env is None or (isinstance(env, str) and (env.startswith(PETTINGZOO) or is_vmas(env))):
        return None  # several agents: the algorithm's own defaults, without making one
    try:
        made = env if isinstance(env, gym.Env) else config_creator(env)(dict(settings.get("env_config") or {}))
    except Exception as e:  # the run's own make says more where it makes its envs, if it fails there too
        warn(
            f"could not make '{env_name(env)}' to pick its kind's defaults ({shorten(str(e))}); the "
            f"algorithm's own apply."
        )
        return None
    try:
        if not isinstance(made, gym.Env) or hasattr(made, "possible_agents"):
            return None  # several agents, or shoal's native AgentEnv: the algorithm's own defaults
        obs_space, act_space = getattr(made, "observation_space", None), getattr(made, "action_space", None)
        # pixels, as the CNN reads them; a Dict holding an image, or a float tensor, is the user's model to choose
        if isinstance(obs_space, gym.Space) and is_pixels(obs_space):
            return "image"
        return "box" if isinstance(act_space, gym.spaces.Box) else None
    finally:
        if made is not env:
            with contextlib.suppress(Exception):  # a probe's env that fails to close changes no setting
                made.close()


def prepare_process(config: TrainerConfig) -> None:
    """What a run sets for its whole process: torch's threads, denormal flushing, the global seeds."""
    torch.set_num_threads(config.torch_threads)
    # Adam's second moments and annealed updates drift into denormal floats late in training,
    # which slows every CPU op several-fold; flushing them to zero costs nothing.
    torch.set_flush_denormal(True)
    seed_everything(config.seed)


def training_backend(config: TrainerConfig) -> VecBackend:
    """The envs a run trains on: local ones, those of its Ray rollout workers (``backend='ray'``), or
    the slots external simulators call into (``backend='external'``: the env only names the spaces)."""
    if config.env is None:  # learning from datasets alone: their spaces stand in for the env
        return recorded_spaces(config)
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
        # the actors' body is a collector, which the backend (below shoal.collect) is handed, not importing it
        return with_action_rules(WorkerSet(config, RolloutWorker), config)
    return build_backend(config, config.num_envs, config.num_workers)


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
        backend.turn_based,
    )


def env_spec_json(env: Any, env_config: dict[str, Any]) -> str | None:
    """The Gymnasium spec of a registered env id, with the run's ``env_config`` (``gym.make``'s
    keyword arguments) in it, as JSON, which a dataset records so that Minari can make the env again
    (None for anything else)."""
    if not isinstance(env, str) or ":" in env:
        return None
    try:
        import dataclasses

        import gymnasium as gym

        spec = gym.spec(env)
        kwargs = dict(env_config)
        steps = kwargs.pop("max_episode_steps", spec.max_episode_steps)
        return dataclasses.replace(spec, kwargs={**spec.kwargs, **kwargs}, max_episode_steps=steps).to_json()
    except Exception:  # not a Gymnasium id (a shoal name, PettingZoo, VMAS) or a spec that does not serialize
        return None


def run_dir(config: TrainerConfig, algo_name: str, env_name: str) -> Path | None:
    """The run's directory (None when it saves nothing), checked to be usable. A new name is
    recorded in the config, so a checkpoint knows where its run logs."""
    c = config
    if not c.save_outputs:
        return None
    if not c.run_dir:
        name = c.name or f"{algo_name}_{env_name}_seed{c.seed}_{datetime.now():%Y%m%d-%H%M%S}"
        c.run_dir = str(Path("runs") / name.replace("/", "_"))
    check_run_dir(Path(c.run_dir))
    return Path(c.run_dir)


def check_run_dir(path: Path) -> None:
    """Refuse, before anything trains, a run directory that cannot hold a run: a file, or under one;
    one this user cannot write; one whose ``checkpoints`` is not a directory."""
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under '{existing}', which is a file"
        raise ConfigError(f"run_dir '{path}' {where}; give a directory (--run-dir or run_dir=...).")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir '{path}' cannot be written: this user may not write to '{existing}'.")
    checkpoints = path / "checkpoints"
    if checkpoints.exists() and not checkpoints.is_dir():
        raise ConfigError(
            f"run_dir '{path}' holds a file named 'checkpoints', where the run keeps its checkpoints "
            f"(a directory); move the file or give another run_dir."
        )
