"""PPO's end-to-end throughput with Ray rollout workers next to worker processes, same counts.

    python benchmarks/ray_workers.py [--timesteps 16384] [--env busy|wait]

PPO (default settings, 8 envs, 128 steps per env an iteration) on the 1 ms env of
benchmarks/busy_env.py with 1 and 2 env workers: as processes over shared memory
(``num_workers``) and as Ray actors on a local cluster (``backend=ray``). Prints env steps per
second, Ray against processes as a ratio for each count, and Ray's overhead per iteration: the
sampling time beyond the slowest worker's own collecting (weights out, the calls, fragments back).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray

import shoal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # makes benchmarks.busy_env importable here
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # and in actors

ENVS = {"busy": "benchmarks.busy_env:Busy-v0", "wait": "benchmarks.busy_env:Wait-v0"}


def run(env: str, backend: str, workers: int, timesteps: int) -> dict[str, Any]:
    settings = dict(env=env, num_envs=8, rollout_fragment_length=128, backend=backend, num_workers=workers)
    with shoal.PPO(**settings, save_outputs=False, verbose=0) as algo:
        algo.train()  # warm-up: the workers receive their share of the storage once
        overheads, start = [], time.perf_counter()
        while algo.timesteps_total < timesteps:
            overheads.append(algo.train().get("remote_overhead_ms", 0.0))
        elapsed = time.perf_counter() - start
        steps = (len(overheads)) * algo.config.train_batch_size
    return {"sps": steps / elapsed, "overhead_ms": statistics.median(overheads)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timesteps", type=int, default=16384)
    parser.add_argument("--env", choices=sorted(ENVS), default="busy")
    args = parser.parse_args()
    env = ENVS[args.env]
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rows = {(backend, w): run(env, backend, w, args.timesteps) for w in (1, 2) for backend in ("local", "ray")}
    ray.shutdown()
    print(f"PPO on the 1 ms {args.env} env, 8 envs x 128 steps an iteration, {os.cpu_count()} cores")
    print(f"{'workers':>8}{'processes sps':>16}{'Ray sps':>10}{'Ray / processes':>18}{'Ray overhead ms/iter':>23}")
    for w in (1, 2):
        mp, remote = rows[("local", w)], rows[("ray", w)]
        ratio = remote["sps"] / mp["sps"]
        print(f"{w:>8}{mp['sps']:>16,.0f}{remote['sps']:>10,.0f}{ratio:>17.2f}x{remote['overhead_ms']:>23.1f}")
    scale = rows[("ray", 2)]["sps"] / rows[("ray", 1)]["sps"]
    print(f"\nRay 2 workers / 1 worker: {scale:.2f}x")


if __name__ == "__main__":
    main()
