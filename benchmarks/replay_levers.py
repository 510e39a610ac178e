"""What overlapping collection and replay work with the gradient step could buy SAC, and what
intra-op threads buy, on a cheap env and a costlier one.

SAC with Stable-Baselines3's defaults (256x256 actor and twin critics, minibatches of 256, one step
per env step) on Pendulum-v1 and BipedalWalker-v3 (Box2D: an env step costs more), at one torch
thread and at all cores, each seed in a fresh process. After a warm-up past ``learning_starts``,
each env step's time splits into

    collecting  acting and stepping the env (the collector's own time)
    replay      adding the step to the replay buffer, drawing and gathering a minibatch
    learning    the rest: the gradient step and the loop around it

and the table gives end-to-end SPS, those shares, "overlap bound" (the SPS if collecting and the
replay work ran wholly beside the gradient step, on another core, at no cost to it: the most
that overlapping them could buy) and, on the all-core rows, "threads" (their SPS over the
one-thread row's: what intra-op threads buy).

    python benchmarks/replay_levers.py [--envs Pendulum-v1 BipedalWalker-v3] [--seeds 1 2 3]
        [--threads 1 2] [--window 1500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from workers import serve, spawn

WARM = 500  # env steps before timing: past learning_starts (100), the buffer and caches warm


def shares(args: dict) -> dict:
    """One run's SPS over ``window`` env steps and the shares of its time collecting and in replay work."""
    import shoal

    trainer = shoal.Trainer(
        algo="sac", env=args["env"], seed=args["seed"], tuned=False, save_outputs=False, verbose=0,
        torch_threads=args["threads"], timesteps_per_iteration=250,
    )  # fmt: skip
    trainer.learn(WARM)
    algorithm, spent = trainer.algorithm, [0.0]

    def timed(work: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return work(*a, **k)
            finally:
                spent[0] += time.perf_counter() - start

        return run

    algorithm.replay.add = timed(algorithm.replay.add)
    algorithm.replay.sample = timed(algorithm.replay.sample)
    algorithm.minibatch = timed(algorithm.minibatch)
    total = collecting = 0.0
    before = trainer.timesteps_total
    while trainer.timesteps_total - before < args["window"]:
        result = trainer.train()
        total += result["time_this_iter_s"]
        collecting += result["sample_time_ms"] / 1e3
    return {
        "sps": (trainer.timesteps_total - before) / total,
        "collecting": collecting / total,
        "replay": spent[0] / total,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--envs", nargs="+", default=["Pendulum-v1", "BipedalWalker-v3"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, nargs="+", help="torch threads of each row (default: 1 and the cores)")
    parser.add_argument("--window", type=int, default=1500, help="timed env steps of each run")
    args = parser.parse_args()
    if serve(args.worker, {"shares": shares}):
        return 0
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    print("| env | threads | SPS | collecting | replay | learning | overlap bound | threads |")
    print("|---|" + "---|" * 7)
    for env in args.envs:
        one_thread = None
        for count in threads:
            runs = [spawn(__file__, "shares", env=env, seed=s, threads=count, window=args.window) for s in args.seeds]
            sps, collecting, replay = (statistics.mean(r[key] for r in runs) for key in ("sps", "collecting", "replay"))
            learning = 1.0 - collecting - replay
            gain = "-" if one_thread is None else f"{sps / one_thread:.2f}x"
            one_thread = sps if count == 1 else one_thread
            print(
                f"| {env} | {count} | {sps:,.0f} | {collecting:.1%} | {replay:.1%} | {learning:.1%} "
                f"| {sps / learning:,.0f} ({1 / learning:.2f}x) | {gain} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
