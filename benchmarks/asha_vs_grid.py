"""ASHA against the grid it prunes: sixteen PPO configurations on LunarLander-v3 (step size x gamma
x entropy coefficient, each from the tuned config, seed 1, 1M steps), run in full
(``sweeps/lunarlander_grid.yaml``) and under successive halving
(``sweeps/lunarlander_asha.yaml``: rungs at 31.25k, 125k and 500k steps, the best quarter kept).

Both sweeps run one trial at a time in this process (``--sequential``), so ASHA's decisions
depend on the trials' order alone and the figures repeat; running the command again resumes
them, or reads them when they are done. It prints, for each sweep, the env steps of all its trials,
the trials that ran to 1M steps, and its best configuration with its final training return
(``episode_reward_mean`` at its last iteration). The target: ASHA's best within 5% of the grid's,
in at most 40% of the grid's env steps.

``--replay GRACE:RF ...`` also replays successive halving with other rungs over the grid's own
learning curves (each trial's results fed, in the sweep's order, to the same rule the scheduler
applies, until it stops the trial), and prints what each would have spent and found. The runs
are deterministic, so a trial that ASHA lets go on repeats the grid's trial.

    python benchmarks/asha_vs_grid.py [--out runs/asha] [--replay 62500:4 31250:4]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from shoal.experiments import load_experiments, run_experiments, trials
from shoal.experiments.run import RungBook
from shoal.experiments.spec import Halving
from shoal.logging.runs import load_run, resolve_metric

HERE = Path(__file__).parent / "sweeps"
SWEEPS = {"grid": HERE / "lunarlander_grid.yaml", "asha": HERE / "lunarlander_asha.yaml"}


def summary(out: Path, file: Path) -> dict:
    """Env steps of every trial, the trials at the budget, and the best of those with its return."""
    (experiment,) = load_experiments(file)
    budget = experiment.stop["timesteps_total"]
    steps, finals = 0, {}
    for trial_json in sorted((out / experiment.name).glob("trial_*/trial.json")):
        run_dir = trial_json.parent
        result = json.loads((run_dir / "result.json").read_text())
        steps += result["timesteps_total"]
        if result["timesteps_total"] >= budget:
            run = load_run(run_dir)
            returns = [v for v in run.series(resolve_metric([run], "episode_reward_mean")) if math.isfinite(v)]
            params = json.loads(trial_json.read_text())["params"]
            finals[", ".join(f"{k}={v}" for k, v in params.items() if k != "seed")] = returns[-1]
    best = max(finals, key=finals.__getitem__)
    return {"steps": steps, "at budget": len(finals), "best": best, "return": finals[best]}


def replay(out: Path, file: Path, grace: float, rf: float) -> dict:
    """Successive halving with rungs at ``grace`` times powers of ``rf``, over the grid's curves."""
    (experiment,) = load_experiments(file)
    budget = experiment.stop["timesteps_total"]
    steps, finals = 0, {}
    with tempfile.TemporaryDirectory() as scratch:
        book = RungBook(Halving("episode_reward_mean", grace, rf), Path(scratch) / "rungs.json")
        for trial in trials(experiment):
            run = load_run(out / experiment.name / trial.name)
            key = resolve_metric([run], "episode_reward_mean")
            last = {}
            for row in run.rows:
                last = row
                result = {"timesteps_total": row["timesteps_total"], "episode_reward_mean": row.get(key)}
                if row["timesteps_total"] < budget and book.pruned_at(trial.name, result) is not None:
                    break
            steps += last["timesteps_total"]
            if last["timesteps_total"] >= budget:
                finals[", ".join(f"{k}={v}" for k, v in trial.params.items() if k != "seed")] = last.get(key)
    best = max(finals, key=finals.__getitem__)
    return {"steps": steps, "at budget": len(finals), "best": best, "return": finals[best]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/asha", help="directory of the two sweeps")
    parser.add_argument("--replay", nargs="*", default=[], metavar="GRACE:RF", help="other rungs, replayed")
    args = parser.parse_args()
    rows = {}
    for name, file in SWEEPS.items():
        out = Path(args.out) / name
        if not run_experiments(file, out, sequential=True, verbose=1, command=f"python {__file__}"):
            print(f"the {name} sweep did not finish; run the command again to resume it")
            return 1
        rows[name] = summary(out, file)
    grid, asha = rows["grid"], rows["asha"]
    print("\n| sweep | env steps | share of the grid's | trials at 1M | best configuration | final return |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        share = row["steps"] / grid["steps"]
        print(f"| {name} | {row['steps']:,} | {share:.0%} | {row['at budget']} | {row['best']} | {row['return']:.1f} |")
    for spec in args.replay:
        grace, rf = map(float, spec.split(":"))
        rows[f"replayed {grace:g}:{rf:g}"] = row = replay(Path(args.out) / "grid", SWEEPS["grid"], grace, rf)
        share = row["steps"] / grid["steps"]
        print(
            f"| replayed, rungs from {grace:,.0f} x{rf:g} | {row['steps']:,} | {share:.0%} | {row['at budget']} | "
            f"{row['best']} | {row['return']:.1f} |"
        )
    gap = (grid["return"] - asha["return"]) / abs(grid["return"])
    steps = asha["steps"] / grid["steps"]
    verdict = "meets" if gap <= 0.05 and steps <= 0.40 else "misses"
    print(f"\nASHA's best is {gap:.1%} below the grid's, in {steps:.0%} of its env steps: {verdict} (5%, 40%).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
