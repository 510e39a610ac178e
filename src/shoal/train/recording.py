"""``shoal dataset record``: a trained policy's episodes, written as a dataset.

The run's newest good checkpoint is loaded with its own envs stepped in this process, and its
policies act through the same collector and dataset writer as in training (``output``), until
each policy has ``episodes`` whole episodes, taken from its agent rows in turn so that short
episodes are not favoured (``EpisodeQuota``); the episodes under way then are dropped. Without
``explore`` every policy takes its most likely action (DQN's greedy one, TD3's actor output without
noise); with it, it acts as it did in training (sampling, epsilon-greedy, exploration noise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal import offline
from shoal.buffers import RolloutBuffer
from shoal.collect import build
from shoal.errors import ConfigError
from shoal.train import setup
from shoal.train.trainer import Trainer

HORIZON = 64
"""Steps of every env per collect while recording."""

STALLED_STEPS = 100_000
"""Steps of every env with no episode ending anywhere after which recording stops and says so."""


def record_dataset(
    path: str | Path, out: str | Path, episodes: int, *, explore: bool = False, seed: int | None = None
) -> dict[str, Any]:
    """Record ``episodes`` whole episodes of each policy of the run (or checkpoint) at ``path`` into
    the dataset folder ``out``; returns what was written per policy."""
    if episodes < 1:
        raise ConfigError(f"--episodes {episodes}: record at least one episode.")
    local: dict[str, Any] = dict(backend="local", ray_address=None, remote_worker_envs=False, save_outputs=False)
    local |= dict(verbose=0, off_policy_estimation_methods=[], evaluation_interval=None)  # recording estimates nothing
    trainer = Trainer.from_checkpoint(path, **local, **({} if seed is None else {"seed": seed}))
    with trainer:
        c, algorithm = trainer.config, trainer.algorithm
        if c.env is None:
            raise ConfigError(
                f"'{path}' learned from datasets with no env (recorded on '{trainer.env_name}'); recording plays its "
                f"policies in an env, so record a run trained with one."
            )
        critic = build.central_critic(c.central_critic, trainer.backend, trainer.env_name)
        env = setup.env_info(trainer.backend, trainer.env_name, critic)
        recording = c.model_copy(update={"output": str(out)})
        writer = offline.dataset_writer(
            recording,
            env,
            algorithm.name,
            list(trainer.policies),
            setup.env_spec_json(c.env, c.env_config),
            trainer.backend.bounded_actions,
            max_episodes=episodes,
            deterministic=not explore,
        )
        assert writer is not None  # output is set
        # a collector of its own: a run that learned from a dataset (input) has none over its envs
        extras = algorithm.stored_extras()
        collector = build.collector(c, trainer.backend, trainer.policy_map, trainer.tracker, extras, critic)
        collector.deterministic = not explore
        collector.reset(c.seed if seed is None else seed)
        rollout = RolloutBuffer(env, HORIZON, algorithm.extra_fields(), c.device).rollout
        quiet = 0  # steps of every env since any episode ended
        try:
            while not writer.full.wait(0):  # the writer says when it has taken enough
                collector.collect(rollout)
                writer(rollout, collector)
                quiet = 0 if bool((rollout["done"] & rollout["valid"])[:, :-1].any()) else quiet + HORIZON
                if quiet >= STALLED_STEPS:
                    raise ConfigError(
                        f"no episode of '{trainer.env_name}' ended in {quiet:,} steps of each env while recording "
                        f"{path}; record an env whose episodes end (a time limit: env_config max_episode_steps)."
                    )
        finally:
            summary = writer.close()
    return summary
