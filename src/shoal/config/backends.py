"""The checks of who steps the envs: Ray rollout workers and external clients."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.errors import ConfigError

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
