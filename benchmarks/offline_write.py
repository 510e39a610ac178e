"""What writing a dataset costs: PPO on CartPole-v1 with 64 numpy-vectorized envs (the shipped
configs/examples/cartpole_numpy64.yaml, 300k steps), with and without ``output=``, alternating seed
by seed in one run, each run in a fresh process. The target: ``output`` costs at most 10% of SPS.

    python benchmarks/offline_write.py [--seeds 1 2 3] [--timesteps 300000]

Reported per run: SPS of the training loop, and for ``output`` the episodes and steps written and the
dataset's size. The table's last line is the median ratio of SPS with output to SPS without.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import workers

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "examples" / "cartpole_numpy64.yaml"


def train(args: dict) -> dict:
    import shoal
    from shoal.config import load_yaml

    settings = load_yaml(CONFIG) | {"seed": args["seed"], "save_outputs": False, "verbose": 0}
    folder = tempfile.mkdtemp(prefix="shoal-offline-write-") if args["output"] else None
    if folder:
        settings["output"] = folder
    algo = shoal.PPO(**settings)
    start = time.perf_counter()
    algo.learn(args["timesteps"])
    seconds = time.perf_counter() - start
    summary = algo.dataset_writer.close() if algo.dataset_writer else {}
    algo.close()
    row = {"sps": algo.timesteps_total / seconds, "steps": algo.timesteps_total}
    if folder:
        written = summary["default_policy"]
        size = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
        row |= {"episodes": written["episodes"], "written": written["steps"], "mb": size / 1e6}
        shutil.rmtree(folder)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--timesteps", type=int, default=300_000)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if workers.serve(args.worker, {"train": train}):
        return
    rows = []
    for seed in args.seeds:
        for output in (False, True):
            row = workers.spawn(__file__, "train", seed=seed, output=output, timesteps=args.timesteps)
            rows.append((seed, output, row))
            extra = f"  {row['episodes']:,} episodes, {row['written']:,} steps, {row['mb']:.1f} MB" if output else ""
            print(f"seed {seed}  output={output!s:5}  {row['sps']:>9,.0f} SPS{extra}", flush=True)
    ratios = [with_output["sps"] / plain["sps"] for (_, _, plain), (_, _, with_output) in zip(rows[::2], rows[1::2])]
    plain_sps = statistics.median(r["sps"] for _, out, r in rows if not out)
    out_sps = statistics.median(r["sps"] for _, out, r in rows if out)
    print()
    print("| run | SPS (median) |")
    print("|---|---|")
    print(f"| PPO, 64 numpy envs | {plain_sps:,.0f} |")
    print(f"| same, output= | {out_sps:,.0f} |")
    print(f"| ratio, seed by seed (median) | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
