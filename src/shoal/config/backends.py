"""The checks of who steps the envs: this process or worker processes, Ray rollout workers, external clients."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shoal.errors import ConfigError, shorten, warn

if TYPE_CHECKING:
    from shoal.config.trainer import TrainerConfig


def check_ray(c: TrainerConfig) -> None:
    problem = (
        "needs num_workers >= 1 (the number of rollout worker actors), e.g. num_workers=2"
        if not c.num_workers
        else f"steps each actor's envs in order; async_factor={c.async_factor} needs remote_worker_envs=True"
        if c.async_factor > 1 and not c.remote_worker_envs
        else f"makes its envs one by one; vectorization_mode='{c.vectorization_mode}' is for local envs"
        if c.vectorization_mode
        else None
    )
    if problem:
        raise ConfigError(f"backend='ray' {problem}.")


def check_external(c: TrainerConfig) -> None:
    n, f = c.num_envs, c.async_factor
    problem = (
        "has no envs to step in workers (clients run them): leave num_workers=0 and vectorization_mode unset"
        if c.num_workers or c.vectorization_mode
        else f"needs num_envs={n} a multiple of async_factor={f} (equal groups); try num_envs={(n // f + 1) * f}"
        if n % f
        else None
    )
    if problem:
        raise ConfigError(f"backend='external' {problem}.")


def check_workers(c: TrainerConfig) -> None:
    """How the envs are split over worker processes, actors and ``async_factor`` groups; setting
    ``ray_address`` chooses ``backend='ray'``."""
    if c.ray_address is not None and c.backend != "ray":
        if "backend" in c.model_fields_set:
            raise ConfigError(
                f"ray_address={shorten(repr(c.ray_address))} is for backend='ray', not backend='{c.backend}'."
            )
        c.backend = "ray"
    if c.backend == "ray":
        check_ray(c)
    if c.backend == "external":
        check_external(c)
        return
    n, w = c.num_envs, c.num_workers
    if w and c.vectorization_mode:
        raise ConfigError(
            f"num_workers={w} and vectorization_mode='{c.vectorization_mode}' both choose how envs "
            f"are stepped; set one of them."
        )
    if w and n % w:
        fits = [d for d in range(1, n + 1) if n % d == 0]
        near = min(fits, key=lambda d: abs(d - w))
        raise ConfigError(
            f"num_envs={n} must be a multiple of num_workers={w} (each worker steps the same "
            f"number of envs). Try num_workers={near} or num_envs={(n // w + 1) * w}."
        )
    f = c.async_factor
    if f > 1 and not w:
        raise ConfigError(
            f"async_factor={f} needs env worker processes to overlap with; set num_workers to a "
            f"multiple of {f} (e.g. num_workers={f}) or async_factor=1."
        )
    if f > 1 and w % f and not c.remote_worker_envs:  # env actors form the groups inside each worker
        fits = [d for d in range(1, w + 1) if w % d == 0]
        near = min(fits, key=lambda d: abs(d - f))
        raise ConfigError(
            f"num_workers={w} must be a multiple of async_factor={f} (each of the {f} groups gets "
            f"the same number of workers). Try async_factor={near} or num_workers={(w // f + 1) * f}."
        )
    cores = os.cpu_count() or 1
    if w > cores and c.backend == "local":  # Ray actors may run on other machines
        warn(f"num_workers={w} is more than the {cores} CPU cores here; workers will contend for them.")
