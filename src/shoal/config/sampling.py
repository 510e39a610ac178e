"""The checks of the sampling keys (``docs/sampling.md``): reward clipping, horizons and
``no_done_at_end`` (which wrap each env shoal makes, so they need such envs), and complete
episodes (which need the longest episode, to size the storage)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.envs.atari import is_atari_id
from shoal.envs.horizon import stepped_as_one_vector
from shoal.errors import ConfigError, shorten
from shoal.vector.vmas import is_vmas as _is_vmas

if TYPE_CHECKING:
    from shoal.config.trainer import TrainerConfig


def check_sampling(c: TrainerConfig) -> None:
    """Each check below in turn; the first problem found is raised."""
    _check_clipping_and_episodes(c)
    _check_remote_envs(c)
    _check_restarts(c)
    _check_episode_rules(c)


LONGEST_COMPLETE_EPISODE = 100_000
"""The longest episode ``batch_mode='complete_episodes'`` sizes its storage for (two per agent row)."""


def _check_clipping_and_episodes(c: TrainerConfig) -> None:
    if isinstance(c.clip_rewards, float) and not c.clip_rewards > 0:
        raise ConfigError(
            f"clip_rewards={c.clip_rewards} must be positive (rewards are clipped to [-c, c]), "
            f"True (their sign) or false."
        )
    if c.batch_mode == "complete_episodes" and (c.backend == "external" or c.longest_episode is None):
        why = (
            "with backend='external' the clients decide when episodes end"
            if c.backend == "external"
            else f"the env {shorten(repr(c.env))} declares no episode limit; set horizon=H (episodes end after H "
            f"steps), or for a turn-based env declare the most turns a game takes as env_config="
            f"{{'max_episode_steps': N}}, made by a factory that takes env_config (env=lambda config: game.env())"
        )
        raise ConfigError(
            f"batch_mode='complete_episodes' sizes its storage for the longest episode, and {why}; or use "
            f"batch_mode='truncate_episodes'."
        )
    longest = c.longest_episode
    if c.batch_mode == "complete_episodes" and longest is not None and longest > LONGEST_COMPLETE_EPISODE:
        raise ConfigError(
            f"batch_mode='complete_episodes' keeps room for two whole episodes in every agent row, and episodes "
            f"here may last {longest} steps (horizon or the env's limit); up to {LONGEST_COMPLETE_EPISODE:,} fit. "
            f"Set a shorter horizon, or use batch_mode='truncate_episodes'."
        )


def _check_remote_envs(c: TrainerConfig) -> None:
    if c.remote_worker_envs and (c.backend != "ray" or c.vectorization_mode is not None or _is_vmas(c.env)):
        raise ConfigError(
            "remote_worker_envs makes each env of a Ray rollout worker an actor of its own: it needs backend='ray' "
            "(with num_workers) and envs made one by one (not a VMAS scenario or vectorization_mode)."
        )
    per_worker = c.num_envs // max(c.num_workers, 1)
    if c.remote_worker_envs and per_worker % c.async_factor:
        raise ConfigError(
            f"remote_worker_envs steps each worker's {per_worker} envs in async_factor={c.async_factor} equal groups; "
            f"use a num_envs that gives each of the num_workers={c.num_workers} workers a multiple of it."
        )


def _check_restarts(c: TrainerConfig) -> None:
    """Envs made anew (``restart_failed_envs``) and workers started anew (``recreate_failed_workers``)."""
    if c.restart_failed_envs and (c.backend == "external" or c.remote_worker_envs):
        where = "with backend='external' the simulators" if c.backend == "external" else "remote_worker_envs"
        raise ConfigError(
            f"restart_failed_envs makes a failed env anew where it steps: in this process, a worker process or a "
            f"Ray rollout worker; {where} make their own envs (leave it out there)."
        )
    if c.restart_failed_envs and (c.vectorization_mode is not None or _is_vmas(c.env)):
        raise ConfigError(
            "restart_failed_envs makes a failed env anew, which needs envs that shoal makes one by one (not a "
            "VMAS scenario or vectorization_mode)."
        )
    restarts = "restart_failed_envs" if c.restart_failed_envs else "recreate_failed_workers"
    if (c.restart_failed_envs or c.recreate_failed_workers) and getattr(c, "n_step", 1) > 1:
        # the episode before a restart ends without a done (a replaced Ray worker's too): n-step windows run across
        raise ConfigError(
            f"{restarts} is not for this algorithm yet: n-step returns would run across the restart (n_step=1 works)."
        )
    cuts_steps = c.restart_failed_envs or (c.recreate_failed_workers and c.backend == "local")
    if cuts_steps and c.NO_RESTARTS:  # a replaced Ray worker samples its whole fragment again instead
        ray = (
            ""
            if c.restart_failed_envs
            else "; a dead Ray rollout worker (backend='ray') is replaced without cutting one"
        )
        raise ConfigError(f"{restarts} is not for this algorithm yet: {c.NO_RESTARTS}{ray}.")
    if c.recreate_failed_workers and (
        c.backend == "external" or not c.num_workers or (c.backend == "local" and c.vectorization_mode is not None)
    ):
        raise ConfigError(
            "recreate_failed_workers starts dead env workers anew: it needs num_workers > 0, as worker processes "
            "(backend='local', envs made one by one) or Ray rollout workers (backend='ray')."
        )


def _check_episode_rules(c: TrainerConfig) -> None:
    """``info_keys`` and the rules that wrap each env shoal makes (horizons, ``no_done_at_end``)."""
    if c.info_keys and c.backend == "external":
        raise ConfigError(
            "info_keys reads the step infos of envs that shoal steps; with backend='external' the simulators "
            "step their own envs."
        )
    if c.soft_horizon and c.horizon is None:
        raise ConfigError("soft_horizon=True cuts episodes at the horizon; set horizon=H too.")
    if not c.episode_rules.active:
        return
    if c.vectorization_mode is not None:
        raise stepped_as_one_vector(f"vectorization_mode='{c.vectorization_mode}'")
    if c.backend == "external":
        raise ConfigError(
            "horizon / no_done_at_end act on envs shoal steps; with backend='external' the clients end "
            "their episodes (end_episode with truncated=True at a time limit)."
        )
    if isinstance(c.env, str) and is_atari_id(c.env):
        raise ConfigError(
            f"horizon / no_done_at_end on {shorten(repr(c.env))}: training episodes end at each lost life and "
            f"evaluation plays whole games, so a horizon would mean two things; limit the game with "
            f"env_config={{'max_num_frames_per_episode': N}} instead."
        )
