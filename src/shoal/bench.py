"""``shoal bench``: env-only and end-to-end training throughput, printed as a table.

Env-only stepping sends fixed random actions (drawn once, cycled), so the figure is the
backend's ceiling: what training could reach if inference and learning were free.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from shoal.vector import make_backend


def env_sps(
    env: str, num_envs: int, num_workers: int = 0, async_factor: int = 1, seconds: float = 5.0, seed: int = 0
) -> dict[str, Any]:
    """Agent steps per second of a backend stepping ``env`` with random actions."""
    backend = make_backend(env, num_envs, None, None, num_workers, async_factor)
    try:
        space = backend.act_spec.space
        bank = torch.as_tensor(
            np.stack([np.stack([space.sample() for _ in range(backend.num_rows)]) for _ in range(16)])
        )
        backend.reset(seed)
        for _ in range(async_factor):  # start every group stepping
            batch = backend.recv()
            backend.send(bank[0][batch.rows])
        steps, i = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch = backend.recv()
            i = (i + 1) % len(bank)
            backend.send(bank[i][batch.rows])
            steps += len(batch.env_id)
        elapsed = time.perf_counter() - start
    finally:
        backend.close()
    return {
        "env": env,
        "backend": "mp" if num_workers else "serial",
        "num_envs": num_envs,
        "num_workers": num_workers,
        "async_factor": async_factor,
        "sps": steps / elapsed,
        "seconds": elapsed,
    }


def train_sps(settings: dict[str, Any], timesteps: int) -> dict[str, Any]:
    """End-to-end training steps per second over ``timesteps`` env steps (no outputs written)."""
    from shoal.train import Trainer

    with Trainer(**{**settings, "save_outputs": False, "verbose": 0}) as algo:
        start = time.perf_counter()
        result = algo.learn(timesteps)
        elapsed = time.perf_counter() - start
        c = algo.config
    return {
        "env": algo.env_name,
        "num_envs": c.num_envs,
        "num_workers": c.num_workers,
        "timesteps": algo.timesteps_total,
        "sps": algo.timesteps_total / elapsed,
        "seconds": elapsed,
        "episode_reward_mean": result.get("episode_reward_mean"),
    }


def seed_sweep_args(description: str, **options: tuple[type, Any]) -> tuple[Any, dict[str, Any]]:
    """Command-line arguments of a benchmark run over seeds: ``--seeds``, the given ``--<option>``
    (name -> (type, default)) and ``key=value`` config overrides. Returns the parsed arguments and
    the overrides (printed when there are any)."""
    import argparse

    from shoal.config import parse_overrides

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    for name, (kind, default) in options.items():
        parser.add_argument(f"--{name}", type=kind, default=default)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    overrides = parse_overrides(args.overrides)
    if overrides:
        print("settings:", " ".join(args.overrides))
    return args, overrides
