"""PPO's throughput on an env whose step waits 20 ms: worker processes, Ray workers, and Ray
workers whose envs are actors of their own (``remote_worker_envs``), with the same counts.

    python benchmarks/remote_envs.py [--timesteps 2048] [--step-ms 20]

8 envs, 2 workers, 32 steps per env an iteration. ``Wait-v0`` (benchmarks/busy_env.py) sleeps
``step_ms`` per step, like an env talking to a simulator in another process: a worker that steps
its 4 envs one after another waits 4 x 20 ms per step, while env actors all wait at once. Prints
env steps per second of training for each setup and its ratio to worker processes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray

import shoal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # makes benchmarks.busy_env importable here
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # and in actors

SETUPS: dict[str, dict[str, Any]] = {
    "worker processes": dict(num_workers=2),
    "worker processes, async_factor=2": dict(num_workers=2, async_factor=2),
    "Ray workers": dict(backend="ray", num_workers=2),
    "Ray workers, remote_worker_envs": dict(backend="ray", num_workers=2, remote_worker_envs=True),
    "Ray workers, remote_worker_envs, async_factor=2": dict(
        backend="ray", num_workers=2, remote_worker_envs=True, async_factor=2
    ),
}


def sps(settings: dict[str, Any], step_ms: float, timesteps: int) -> float:
    common = dict(env="benchmarks.busy_env:Wait-v0", env_config={"step_ms": step_ms}, num_envs=8)
    common |= dict(rollout_fragment_length=32, sgd_minibatch_size=64, save_outputs=False, verbose=0)
    with shoal.PPO(**common, **settings) as algo:
        algo.train()  # warm-up: workers and actors started, storage shared
        start, before = time.perf_counter(), algo.timesteps_total
        while algo.timesteps_total - before < timesteps:
            algo.train()
        return (algo.timesteps_total - before) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=2048)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rows = {name: sps(settings, args.step_ms, args.timesteps) for name, settings in SETUPS.items()}
    ray.shutdown()
    base = rows["worker processes"]
    print(f"PPO on Wait-v0 ({args.step_ms:g} ms a step), 8 envs, 2 workers, {os.cpu_count()} cores")
    print(f"{'setup':<50}{'env steps/s':>12}{'vs processes':>14}")
    for name, value in rows.items():
        print(f"{name:<50}{value:>12,.0f}{value / base:>13.2f}x")


if __name__ == "__main__":
    main()
