"""Atari throughput and rollout memory: ALE/Breakout-v5 with shoal's preprocessing, 8 envs stepped
in this process against 2 worker processes (in lockstep, and async); and the rollout's bytes
against N x (T+1) x 84 x 84 x 4.

    python benchmarks/atari.py [--seconds 20] [--train-steps 8192] [key=value ...]

Env-only SPS steps the 8 preprocessed envs with random actions (each agent step is 4 emulator
frames); training SPS runs PPO with configs/ppo/ALE-Breakout-v5.yaml (the Nature CNN, 8 x 128 steps
per update) for ``--train-steps`` env steps after one warm-up update. Memory: the rollout of that
config holds its frames as uint8; the table gives the obs storage's bytes next to the formula,
and the resident memory the process gained when it copied the rollout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

import shoal
from shoal.bench import env_sps
from shoal.config import load_yaml, merge_settings, parse_overrides

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo" / "ALE-Breakout-v5.yaml"
ENV = "ALE/Breakout-v5"


def train_sps(settings: dict, workers: int, groups: int, steps: int) -> tuple[float, float]:
    """End-to-end env steps per second after one warm-up update, and the share spent collecting."""
    run = {**settings, "num_workers": workers, "async_factor": groups, "save_outputs": False, "verbose": 0}
    with shoal.PPO(**run) as algo:
        algo.train()
        start, sample_ms = time.perf_counter(), 0.0
        first = algo.timesteps_total
        while algo.timesteps_total - first < steps:
            sample_ms += algo.train()["sample_time_ms"]
        wall = time.perf_counter() - start
        return (algo.timesteps_total - first) / wall, sample_ms / 1e3 / wall


def rollout_memory(settings: dict) -> tuple[int, int, int, int]:
    """(obs bytes, the formula's bytes, all rollout bytes, resident memory a copy of the rollout takes)."""
    with shoal.PPO(**{**settings, "save_outputs": False, "verbose": 0}) as algo:
        rollout = algo.algorithm.buffer.rollout
        n, t1 = rollout.batch_size
        obs = rollout["obs"]
        total = sum(x.numel() * x.element_size() for x in rollout.values())
        process = psutil.Process()
        before = process.memory_info().rss
        copy = rollout.clone()  # every page written, so resident memory grows by what a rollout really takes
        grown = process.memory_info().rss - before
        del copy
        return obs.numel() * obs.element_size(), n * t1 * 84 * 84 * 4, total, grown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="env-only measuring time per backend")
    parser.add_argument("--train-steps", type=int, default=8192)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    settings = merge_settings(load_yaml(CONFIG), parse_overrides(args.overrides))
    n = settings["num_envs"]
    print(f"{ENV}, {n} envs, Atari preprocessing (frame skip 4: an env step is 4 emulator frames)")
    print(f"{'backend':<22} {'env-only SPS':>13} {'training SPS':>13} {'collecting':>11}")
    # With async_factor 1 the collector waits for both workers every step, so each step costs the
    # slower worker's time (Atari steps vary: resets, lost lives); with 2 each worker goes on alone.
    for label, workers, groups in (
        ("serial (this process)", 0, 1),
        ("2 worker processes", 2, 1),
        ("2 workers, async 2", 2, 2),
    ):
        env_only = env_sps(ENV, n, workers, groups, args.seconds)["sps"]
        sps, sampling = train_sps(settings, workers, groups, args.train_steps)
        print(f"{label:<22} {env_only:>13,.0f} {sps:>13,.0f} {sampling:>10.0%}")
    obs, formula, total, grown = rollout_memory(settings)
    t = settings["rollout_fragment_length"]
    print(f"\nrollout of N={n} x (T+1)={t + 1} steps, obs [4, 84, 84] uint8:")
    print(f"  obs storage {obs:,} bytes; N x (T+1) x 84 x 84 x 4 = {formula:,} bytes ({obs / formula:.3f}x)")
    print(
        f"  whole rollout {total:,} bytes ({total / formula:.3f}x the obs formula); resident memory a copy "
        f"of it took: {grown:,} bytes ({grown / formula:.3f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
