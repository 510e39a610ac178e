"""The envs a run's config asks for, as a backend on this machine: in this process, in worker
processes, or (``remote_worker_envs``, inside a Ray rollout worker) each env a Ray actor."""

from __future__ import annotations

from shoal.config import TrainerConfig
from shoal.vector import VecBackend, make_backend


def build_backend(
    config: TrainerConfig, num_envs: int, num_workers: int = 0, evaluation: bool = False, first_env_id: int = 0
) -> VecBackend:
    """Envs that step on this machine: in this process, or in ``num_workers`` worker processes
    (a Ray rollout worker's config asking for ``remote_worker_envs``: each env a Ray actor)."""
    c = config
    if c.remote_worker_envs and c.backend == "local" and not evaluation:
        from shoal.vector.remote_envs import RemoteEnvBackend  # only inside a Ray rollout worker

        return with_action_rules(RemoteEnvBackend(c, num_envs, first_env_id), c)
    backend = make_backend(
        c.env,
        num_envs,
        c.env_config,
        vectorization_mode=c.vectorization_mode,
        num_workers=num_workers,
        async_factor=c.async_factor if num_workers else 1,
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
