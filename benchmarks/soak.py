"""Soak: a long PPO run on worker processes, with periodic checkpoints and evaluations, sampled for
what a leak would grow: the resident memory of the trainer and of each env worker, the trainer's
open file descriptors and its child processes.

    python benchmarks/soak.py [--minutes 60] [--every 30] [--workers 2]

The first sample is taken after a warm-up (the first checkpoint and evaluation, the allocator
settling); the table gives each resource then and at the end, and its growth per hour: the slope
of a least-squares line through every sample, so one late spike does not pass for a trend.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

import shoal

MB = 1024 * 1024


@dataclass
class Sample:
    seconds: float
    trainer_rss_mb: float
    worker_rss_mb: list[float]
    fds: int
    children: int


@dataclass
class Sampler(shoal.Callback):
    """Samples the resources every ``every`` seconds after ``warmup`` seconds, and stops the run
    after ``seconds``."""

    seconds: float
    every: float
    warmup: float
    samples: list[Sample] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)
    iterations: int = 0

    def on_train_result(self, trainer: Any, result: dict[str, Any]) -> bool:
        self.iterations += 1
        now = time.monotonic() - self.start
        due = self.samples[-1].seconds + self.every if self.samples else self.warmup
        if now >= due:
            me = psutil.Process()
            workers = [psutil.Process(pid) for pid in trainer.backend.pids]
            self.samples.append(
                Sample(
                    now,
                    me.memory_info().rss / MB,
                    [w.memory_info().rss / MB for w in workers],
                    me.num_fds(),
                    len(me.children(recursive=True)),
                )
            )
        return now >= self.seconds


def soak(minutes: float, every: float, workers: int = 2) -> Sampler:
    """Train PPO on CartPole-v1 with ``workers`` worker processes for ``minutes``, checkpointing and
    evaluating every 10 iterations; returns the sampler with its samples."""
    seconds = 60 * minutes
    sampler = Sampler(seconds, every, warmup=min(30.0, seconds / 4))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = shoal.PPO(
            env="CartPole-v1",
            num_envs=8,
            num_workers=workers,
            seed=1,
            run_dir=run_dir,
            checkpoint_interval=10,
            keep_checkpoints=2,
            evaluation_interval=10,
            evaluation_num_episodes=4,
            callbacks=[sampler],
            verbose=0,
        )
        with trainer:
            trainer.learn(10**12)
    return sampler


def growth_per_hour(seconds: list[float], values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    slope = np.polyfit(np.asarray(seconds), np.asarray(values), 1)[0]
    return float(slope * 3600)


def table(sampler: Sampler) -> list[tuple[str, float, float, float]]:
    """(resource, at the first sample, at the last, growth per hour) for each resource."""
    s = sampler.samples
    t = [x.seconds for x in s]
    series = {
        "trainer RSS (MB)": [x.trainer_rss_mb for x in s],
        **{f"worker {w} RSS (MB)": [x.worker_rss_mb[w] for x in s] for w in range(len(s[0].worker_rss_mb))},
        "open file descriptors": [float(x.fds) for x in s],
        "child processes": [float(x.children) for x in s],
    }
    return [(name, v[0], v[-1], growth_per_hour(t, v)) for name, v in series.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    sampler = soak(args.minutes, args.every, args.workers)
    s = sampler.samples
    print(
        f"PPO CartPole-v1, {args.workers} worker processes, {args.minutes:g} min, {sampler.iterations} iterations, "
        f"{len(s)} samples from {s[0].seconds:.0f} s to {s[-1].seconds:.0f} s"
    )
    print(f"{'resource':<24}{'first':>10}{'last':>10}{'growth / hour':>16}")
    for name, first, last, growth in table(sampler):
        print(f"{name:<24}{first:>10.1f}{last:>10.1f}{growth:>+16.2f}")


if __name__ == "__main__":
    main()
