"""PPO with model=cnn on MinAtar Breakout-v1: learning curves over seeds and the final evaluation.

    python benchmarks/minatar_breakout.py [--seeds 1 2 3] [--steps 2000000] [--parallel 2] [key=value ...]

Trains configs/ppo/MinAtar-Breakout-v1.yaml once per seed, each in its own process (``--parallel`` at
a time), evaluating the deterministic policy on 20 episodes every ``--every`` iterations; then
prints a table (steps, final training return, final evaluation over 100 episodes, wall time,
SPS, mean and std over seeds, and a uniform random policy's return) and writes the curves
(training return, mean and spread over seeds) to ``<out>/minatar_breakout.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo" / "MinAtar-Breakout-v1.yaml"


def random_return(episodes: int = 500, seed: int = 0) -> float:
    """Mean return of uniform random actions."""
    from shoal.vector import make_backend

    backend = make_backend("MinAtar/Breakout-v1", 1)
    rng, returns, total = np.random.default_rng(seed), [], 0.0
    backend.reset(seed)
    while len(returns) < episodes:
        backend.send(torch.as_tensor(rng.integers(0, 3, 1)))
        batch = backend.recv()
        total += float(batch.reward[0])
        if batch.terminated[0] or batch.truncated[0]:
            returns.append(total)
            total = 0.0
    backend.close()
    return float(np.mean(returns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=2_000_000)
    parser.add_argument("--parallel", type=int, default=2, help="seeds trained at once")
    parser.add_argument("--every", type=int, default=50, help="iterations between evaluations")
    parser.add_argument("--out", default="runs/bench/minatar_breakout")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    out = Path(args.out)
    cmd = [
        sys.executable,
        "-m",
        "shoal",
        "train",
        "--config",
        str(CONFIG),
        f"total_timesteps={args.steps}",
        f"evaluation_interval={args.every}",
        "verbose=0",
        "--eval-episodes",
        "100",
        *args.overrides,
    ]
    pending = {seed: [*cmd, f"seed={seed}", "--run-dir", str(out / f"seed{seed}")] for seed in args.seeds}
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    summaries = {}
    while pending or running:
        while pending and len(running) < args.parallel:
            seed, argv = pending.popitem()
            running[seed] = (subprocess.Popen(argv, stdout=subprocess.PIPE, text=True), time.perf_counter())
        for seed, (proc, start) in list(running.items()):
            if proc.poll() is None:
                continue
            if proc.returncode:
                raise RuntimeError(f"seed {seed} failed with exit code {proc.returncode}")
            summaries[seed] = {**json.loads(proc.stdout.read()), "wall_s": time.perf_counter() - start}
            print(f"  seed {seed} done: {summaries[seed]['evaluation']['episode_reward_mean']:.2f}", file=sys.stderr)
            del running[seed]
        time.sleep(1.0)

    from shoal.logging.runs import plot_runs

    rows = []
    for seed in args.seeds:
        s = summaries[seed]
        rows.append(
            (
                seed,
                s["timesteps_total"],
                s["episode_reward_mean"],
                s["evaluation"]["episode_reward_mean"],
                s["time_total_s"],
                s["timesteps_total"] / s["time_total_s"],
            )
        )
    evals = [r[3] for r in rows]
    print(f"\nMinAtar Breakout-v1, PPO model=cnn ({CONFIG.name}), deterministic evaluation over 100 episodes")
    print(f"{'seed':>4} {'steps':>10} {'train return':>13} {'eval return':>12} {'train time (s)':>15} {'SPS':>7}")
    for seed, steps, train, ev, wall, sps in rows:
        print(f"{seed:>4} {steps:>10,} {train:>13.2f} {ev:>12.2f} {wall:>15.0f} {sps:>7,.0f}")
    spread = statistics.stdev(evals) if len(evals) > 1 else 0.0
    print(
        f"mean eval return over {len(evals)} seeds: {statistics.mean(evals):.2f} ± {spread:.2f}; "
        f"uniform random policy: {random_return():.2f}"
    )
    png = plot_runs(
        [str(out / f"seed{seed}") for seed in args.seeds],
        "episode_reward_mean",
        "timesteps",
        out / "minatar_breakout.png",
    )
    plot_runs(
        [str(out / f"seed{seed}") for seed in args.seeds],
        "evaluation/episode_reward_mean",
        "timesteps",
        out / "minatar_breakout_eval.png",
    )
    print(f"curves: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
