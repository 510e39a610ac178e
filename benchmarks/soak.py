"""Soak: a long PPO run on worker processes or Ray rollout workers, with periodic checkpoints and
evaluations, sampled for what a leak would grow: the resident memory of the trainer and of each
env worker, the open file descriptors of the trainer and of the workers, and the trainer's child
processes and their memory.

    python benchmarks/soak.py [--minutes 60] [--every 30] [--workers 2] [--backend local|ray]

With ``--backend ray`` the trainer starts a local Ray, so Ray's own processes (GCS, raylet, its
agents, its pool of idle Python workers) are the trainer's child processes too: "other child
processes" counts them and sums their memory, apart from the rollout workers' actors, which are
the "worker" rows (found by the pid each actor reports). With worker processes, the other children
are whatever multiprocessing keeps (none, usually).

The first sample is taken after a warm-up (the first checkpoint and evaluation, the allocator
settling), counted from the first iteration: Ray's actors take seconds to start. The table gives
each resource then and at the end, and its growth per hour: the slope of a least-squares line
through every sample, so one late spike does not pass for a trend.
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
    fds: int  # the trainer's
    worker_fds: int  # all workers' together
    children: int
    other_rss_mb: float  # the children that are not env workers, together


def worker_pids(trainer: Any) -> list[int]:
    """The env workers' processes: the worker processes, or the processes of the Ray rollout
    workers' actors (asked each time: a replaced actor is a new process)."""
    if trainer.config.backend == "ray":
        import ray

        return list(ray.get([worker.pid.remote() for worker in trainer.backend.workers]))
    return list(trainer.backend.pids)


def rss_mb(process: psutil.Process) -> float:
    """Its resident memory, or 0 for a process that ended since it was listed (Ray's pool of idle
    workers shrinks and grows)."""
    try:
        return float(process.memory_info().rss / MB)
    except psutil.NoSuchProcess:
        return 0.0


def take_sample(trainer: Any, seconds: float) -> Sample:
    me = psutil.Process()
    pids = worker_pids(trainer)
    workers = [psutil.Process(pid) for pid in pids]
    children = me.children(recursive=True)
    others = [child for child in children if child.pid not in pids]
    return Sample(
        seconds,
        rss_mb(me),
        [rss_mb(w) for w in workers],
        me.num_fds(),
        sum(w.num_fds() for w in workers),
        len(children),
        sum(rss_mb(child) for child in others),
    )


@dataclass
class Sampler(shoal.Callback):
    """Samples the resources every ``every`` seconds after ``warmup`` seconds, and stops the run
    after ``seconds``, both counted from the first iteration."""

    seconds: float
    every: float
    warmup: float
    samples: list[Sample] = field(default_factory=list)
    start: float | None = None
    iterations: int = 0

    def on_train_result(self, trainer: Any, result: dict[str, Any]) -> bool:
        self.iterations += 1
        if self.start is None:
            self.start = time.monotonic()
        now = time.monotonic() - self.start
        due = self.samples[-1].seconds + self.every if self.samples else self.warmup
        if now >= due:
            self.samples.append(take_sample(trainer, now))
        return now >= self.seconds


def soak(minutes: float, every: float, workers: int = 2, backend: str = "local") -> Sampler:
    """Train PPO on CartPole-v1 with ``workers`` worker processes (``backend="local"``) or Ray
    rollout workers (``"ray"``, on a local Ray the trainer starts) for ``minutes``, checkpointing
    and evaluating every 10 iterations; returns the sampler with its samples."""
    seconds = 60 * minutes
    sampler = Sampler(seconds, every, warmup=min(30.0, seconds / 4))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = shoal.PPO(
            env="CartPole-v1",
            backend=backend,
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
        "workers' open fds": [float(x.worker_fds) for x in s],
        "child processes": [float(x.children) for x in s],
        "other children RSS (MB)": [x.other_rss_mb for x in s],
    }
    return [(name, v[0], v[-1], growth_per_hour(t, v)) for name, v in series.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", choices=["local", "ray"], default="local", help="worker processes, or Ray")
    args = parser.parse_args()
    sampler = soak(args.minutes, args.every, args.workers, args.backend)
    s = sampler.samples
    kind = "Ray rollout workers" if args.backend == "ray" else "worker processes"
    print(
        f"PPO CartPole-v1, {args.workers} {kind}, {args.minutes:g} min, {sampler.iterations} iterations, "
        f"{len(s)} samples from {s[0].seconds:.0f} s to {s[-1].seconds:.0f} s"
    )
    print(f"{'resource':<26}{'first':>10}{'last':>10}{'growth / hour':>16}")
    for name, first, last, growth in table(sampler):
        print(f"{name:<26}{first:>10.1f}{last:>10.1f}{growth:>+16.2f}")


if __name__ == "__main__":
    main()
