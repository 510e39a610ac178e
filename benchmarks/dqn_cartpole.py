"""DQN on CartPole-v1 with its tuned config (what ``shoal train CartPole-v1 --algo dqn`` runs): does
it get there, and does it stay there? For each seed: train --steps env steps, evaluating 10
deterministic episodes every --eval-every steps (the learning curve), then 20 at the end.

The table gives each run's final return and the env steps at which an evaluation first reached
475; below it, the share of the evaluations after that one which stayed at 400 or more (the
tuned config is held to: 475 or more at the end on every seed, and at least 90% of the later
evaluations at 400 or more). --plot draws the curves (mean over seeds, min to max shaded).

    python benchmarks/dqn_cartpole.py [--seeds 1 2 3] [--steps 50000] [--eval-every 5000] [--plot curve.png]
        [key=value ...]
"""

from __future__ import annotations

import statistics
import sys

import shoal
from shoal.bench import seed_sweep_args, sweep_seeds

SOLVED, HELD = 475, 400


def held_share(curve: list[tuple[int, float]]) -> float | None:
    """The share of the evaluations after the first at ``SOLVED`` that are at ``HELD`` or more
    (None: none reached ``SOLVED``; 1.0 when it was the last)."""
    first = next((i for i, (_, ret) in enumerate(curve) if ret >= SOLVED), None)
    if first is None:
        return None
    later = [ret >= HELD for _, ret in curve[first + 1 :]]
    return statistics.mean(later) if later else 1.0


def main() -> int:
    args, overrides = seed_sweep_args(__doc__, steps=(int, 50_000), eval_every=(int, 5_000), plot=(str, None))
    runs = {"DQN": lambda seed: {"env": "CartPole-v1", "seed": seed, **overrides}}
    results = sweep_seeds(shoal.DQN, runs, args, SOLVED, "CartPole-v1: DQN, tuned config")
    ok = True
    for seed, out in zip(args.seeds, results["DQN"]):
        share = held_share(out["curve"])
        shown = "never reached" if share is None else f"{share:.0%} of the later evaluations at {HELD}+"
        print(f"seed {seed}: final {out['eval']:.1f}; {SOLVED}: {shown}")
        ok &= out["eval"] >= SOLVED and share is not None and share >= 0.9
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
