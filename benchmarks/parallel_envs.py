"""Throughput of the serial and multiprocessing backends, side by side in one run.

    python benchmarks/parallel_envs.py [--seconds 5] [--timesteps 8192]

Env-only rows: the 1 ms CPU-bound env (benchmarks/busy_env.py) on the serial backend and on 2
workers; CartPole-v1 with 16 envs on 2 workers against Gymnasium's AsyncVectorEnv(shared_memory=True).
End-to-end rows: PPO (default settings) on the 1 ms env with 8 envs on 2 workers, with
async_factor 1 and 2, on the CPU-bound env and on the one that waits instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # makes benchmarks.busy_env importable

from shoal.bench import env_sps, train_sps

BUSY = "benchmarks.busy_env:Busy-v0"
WAIT = "benchmarks.busy_env:Wait-v0"


def gymnasium_async_sps(env_id: str, num_envs: int, seconds: float) -> float:
    venv = gym.vector.AsyncVectorEnv([lambda: gym.make(env_id)] * num_envs, shared_memory=True)
    venv.reset(seed=0)
    actions = np.stack([venv.action_space.sample() for _ in range(16)])
    steps, i, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        venv.step(actions[i % 16])
        i += 1
        steps += num_envs
    elapsed = time.perf_counter() - start
    venv.close()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--timesteps", type=int, default=8192, help="PPO steps per end-to-end row")
    args = parser.parse_args()
    s = args.seconds

    def ppo(env: str, async_factor: int) -> float:
        return train_sps({"env": env, "num_envs": 8, "num_workers": 2, "async_factor": async_factor}, args.timesteps)[
            "sps"
        ]

    rows = [
        ("1 ms env, 8 envs, serial", env_sps(BUSY, 8, seconds=s)["sps"]),
        ("1 ms env, 8 envs, 2 workers", env_sps(BUSY, 8, num_workers=2, seconds=s)["sps"]),
        ("CartPole-v1, 16 envs, 2 workers", env_sps("CartPole-v1", 16, num_workers=2, seconds=s)["sps"]),
        ("CartPole-v1, 16 envs, gymnasium AsyncVectorEnv", gymnasium_async_sps("CartPole-v1", 16, s)),
        ("PPO, 1 ms CPU-bound env, 8 envs, 2 workers, async 1", ppo(BUSY, 1)),
        ("PPO, 1 ms CPU-bound env, 8 envs, 2 workers, async 2", ppo(BUSY, 2)),
        ("PPO, 1 ms waiting env, 8 envs, 2 workers, async 1", ppo(WAIT, 1)),
        ("PPO, 1 ms waiting env, 8 envs, 2 workers, async 2", ppo(WAIT, 2)),
    ]
    print(f"{'run':<55}{'env steps/s':>14}")
    for name, sps in rows:
        print(f"{name:<55}{sps:>14,.0f}")
    print(f"\n2 workers / serial on the 1 ms env: {rows[1][1] / rows[0][1]:.2f}x")
    print(f"shoal 2 workers / AsyncVectorEnv on CartPole-v1: {rows[2][1] / rows[3][1]:.2f}x")
    print(
        f"PPO async_factor 2 / 1, CPU-bound env: {rows[5][1] / rows[4][1]:.2f}x; waiting env: "
        f"{rows[7][1] / rows[6][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
