"""What the trainer does differently as one of several data-parallel ranks (``torchrun``).

Every rank runs the whole loop on envs of its own and learns on its own rollouts, with the
gradients averaged (``shoal.distributed``), so the ranks' policies stay equal. Sizes in the config
(``num_envs``, ``rollout_fragment_length``, ``sgd_minibatch_size``, buffer sizes) are per rank;
``total_timesteps`` and the counters are every rank's env steps together. Rank 0 alone writes
the run directory (logs, checkpoints, ``result.json``), evaluates and prints; the others are quiet.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import torch

from shoal import distributed
from shoal.config import TrainerConfig
from shoal.train import setup

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer


def join(config: TrainerConfig) -> bool:
    """Join the ranks a launcher started (a no-op otherwise) and quiet every rank but 0. Returns
    whether this call joined (and ``close`` should leave)."""
    if distributed.launched() and config.device == "cuda":  # one GPU per rank on each machine
        config.device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(config.device)
    joined = distributed.init_from_environment(torch.device(config.device))
    if distributed.rank() > 0:
        config.save_outputs = False
        config.verbose = 0
        config.evaluation_interval = 0
    return joined


def start(trainer: Trainer) -> None:
    """Give every rank rank 0's weights and statistics, and seed this rank's envs and sampling:
    rank r's envs take the seeds after rank r-1's, as one vector of all the ranks' envs would."""
    if distributed.world_size() == 1:
        return
    for policy in trainer.policies.values():
        distributed.broadcast_([*policy.parameters(), *policy.buffers()])
    _reseed(trainer, trainer.config.seed)


def after_resume(trainer: Trainer) -> None:
    """A resumed run's checkpoint holds rank 0's envs and random state: the other ranks start new
    episodes, seeded by rank and iteration, rather than repeat rank 0's."""
    if distributed.rank() > 0:
        _reseed(trainer, trainer.config.seed + trainer.iteration)


def _reseed(trainer: Trainer, seed: int) -> None:
    rank = distributed.rank()
    trainer.collector.reset(seed + rank * trainer.backend.num_envs)
    setup.seed_everything(seed + rank)


def total_steps(steps: int) -> int:
    """Env steps this iteration, every rank's together."""
    if distributed.world_size() == 1:
        return steps
    return int(distributed.sum_(torch.tensor([steps], dtype=torch.int64)).item())


def episode_stats(summary: dict[str, Any], window: int) -> dict[str, Any]:
    """The tracker's ``summary`` over every rank's episodes: counts summed, means weighted by each
    rank's episodes in the smoothing ``window``, extremes over all. Per-policy, per-agent and custom
    metrics stay this rank's."""
    if distributed.world_size() == 1:
        return summary
    seen = min(summary["episodes_total"], window)
    sums = torch.tensor(
        [
            summary["episodes_this_iter"],
            summary["episodes_total"],
            seen,
            seen * _or(summary["episode_reward_mean"], 0.0),
            seen * _or(summary["episode_len_mean"], 0.0),
        ],
        dtype=torch.float64,
    )
    extremes = torch.tensor(
        [_or(summary["episode_reward_max"], -math.inf), -_or(summary["episode_reward_min"], math.inf)],
        dtype=torch.float64,
    )
    this_iter, total, seen_all, rewards, lengths = distributed.sum_(sums).tolist()
    top, bottom = distributed.maximum_(extremes).tolist()
    mean = (lambda x: x / seen_all) if seen_all else (lambda x: math.nan)
    return summary | {
        "episodes_this_iter": int(this_iter),
        "episodes_total": int(total),
        "episode_reward_mean": mean(rewards),
        "episode_len_mean": mean(lengths),
        "episode_reward_max": top if seen_all else math.nan,
        "episode_reward_min": -bottom if seen_all else math.nan,
    }


def _or(x: float, default: float) -> float:
    """``x``, or ``default`` for the nan of no episodes yet."""
    return default if math.isnan(x) else x
