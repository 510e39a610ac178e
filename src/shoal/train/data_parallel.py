"""What the trainer does differently as one of several data-parallel ranks (``torchrun``).

Every rank runs the whole loop on envs of its own and learns on its own rollouts, with the
gradients averaged (``shoal.distributed``), so the ranks' policies stay equal. Sizes in the config
(``num_envs``, ``rollout_fragment_length``, ``sgd_minibatch_size``, buffer sizes) are per rank;
``total_timesteps`` and the counters are every rank's env steps together. Rank 0 alone writes
the run directory (logs, checkpoints, ``result.json``), evaluates and prints; the others are quiet.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from shoal import distributed
from shoal.config import TrainerConfig
from shoal.errors import ConfigError
from shoal.vector.base import seed_everything

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer


# keys every rank but 0 changes to stay quiet: the ranks' configs may differ in these alone
QUIETED = ("save_outputs", "verbose", "evaluation_interval", "run_dir")
# why a run stops early, as one number the ranks can agree on (the largest wins)
STOP_REASONS = (None, "callback", "SIGTERM", "SIGINT")


def join(config: TrainerConfig) -> bool:
    """Join the ranks a launcher started (a no-op otherwise) and quiet every rank but 0. Returns
    whether this call joined (and ``close`` should leave)."""
    if config.backend == "ray" and distributed.launched():
        raise ConfigError(
            "backend='ray' under torchrun is not supported: every rank would start Ray rollout workers of its "
            "own. Run the ranks with local envs (num_workers for worker processes), or Ray workers in one process."
        )
    joined = distributed.init_from_environment(torch.device(config.device))
    if distributed.rank() > 0:
        config.save_outputs = False
        config.verbose = 0
        config.evaluation_interval = 0
    return joined


def start(trainer: Trainer) -> None:
    """Check that the ranks can learn together, give every rank rank 0's weights and state, and
    seed this rank's envs and sampling: rank r's envs take the seeds after rank r-1's, as one
    vector of all the ranks' envs would."""
    if distributed.world_size() == 1:
        return
    if problem := trainer.algorithm.data_parallel_problem():
        raise ConfigError(f"cannot learn on {distributed.world_size()} data-parallel ranks: {problem}.")
    if differing := distributed.differing_keys(_comparable(trainer.config)):
        raise ConfigError(f"the data-parallel ranks were given different configs: {', '.join(differing)} differ.")
    state = trainer.algorithm.state_dict()
    state.pop("replay", None)  # a replay buffer kept for checkpoints: empty at the start, and large
    distributed.broadcast_(_tensors(state))  # networks, targets, optimizer moments, statistics
    _reseed(trainer, trainer.config.seed)


def _comparable(config: TrainerConfig) -> dict[str, Any]:
    """The config as plain data the ranks can compare: without the keys rank 0 alone keeps, and
    without objects (an env, callbacks, a mapping function), whose reprs hold per-process addresses."""
    settings = {k: v for k, v in config.to_yaml_dict().items() if k not in QUIETED}
    if config.env_is_object:
        del settings["env"]
    settings["callbacks"] = [c for c in config.callbacks if isinstance(c, str)]
    if callable(config.policy_mapping_fn):
        del settings["policy_mapping_fn"]
    return settings


def after_resume(trainer: Trainer) -> None:
    """A resumed run's checkpoint holds rank 0's envs, episodes and random state: the other ranks
    start new episodes, seeded by rank and iteration, rather than repeat (or count) rank 0's."""
    if distributed.rank() > 0:
        _reseed(trainer, trainer.config.seed + trainer.iteration)
        trainer.tracker.forget()


def _reseed(trainer: Trainer, seed: int) -> None:
    rank = distributed.rank()
    trainer.collector.reset(seed + rank * trainer.backend.num_envs)
    seed_everything(seed + rank)


def _tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor in a nested state dict (of lists and dicts), in a fixed order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state, key=str) for t in _tensors(state[key])]
    if isinstance(state, (list, tuple)):
        return [t for item in state for t in _tensors(item)]
    return []


def agreed_stop(trainer: Trainer) -> bool:
    """Whether to stop now, as every rank sees it together: a signal or callback on any rank stops
    them all, with the most urgent reason given on every rank."""
    asked = trainer.stop_reason or ("callback" if trainer.callbacks.stop_requested else None)
    if distributed.world_size() == 1:
        return asked is not None
    code = int(distributed.maximum_(torch.tensor([STOP_REASONS.index(asked)])).item())
    if code and asked is None:
        trainer.stop_reason = STOP_REASONS[code]
    return code > 0


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
