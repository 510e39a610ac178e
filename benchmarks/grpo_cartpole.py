"""GRPO against PPO on CartPole-v1, both with the library defaults. For each algorithm and seed:
train for --steps env steps (every step the envs took counts, GRPO's waiting steps too), evaluate
10 deterministic episodes every --eval-every steps along the way (the learning curve, printed
after the table), then 20 at the end; solved means a final mean return >= 475. The table also
gives the env steps at which an evaluation first reached 475, and from which every later one did.

    python benchmarks/grpo_cartpole.py [--seeds 1 2 3] [--steps 300000] [--plot curves.png] [key=value ...]

``key=value`` overrides go to GRPO only (e.g. ``group_size=16 num_envs=32``). The wall time is
the training's alone (the evaluations along the way are left out). --plot writes both learning
curves (mean over seeds, min to max shaded) to a PNG.
"""

from __future__ import annotations

import sys

import shoal
from shoal.bench import curve_header, curve_row, learning_curve, report_curves, seed_sweep_args


def main() -> int:
    args, overrides = seed_sweep_args(
        __doc__, steps=(int, 300_000), eval_every=(int, 10_000), plot=(str, None), ppo_steps=(int, None)
    )
    results: dict[str, list[dict]] = {"GRPO": [], "PPO": []}
    print(curve_header(475))
    ok = True
    for name, preset in (("GRPO", shoal.GRPO), ("PPO", shoal.PPO)):
        for seed in args.seeds:
            steps = (args.ppo_steps or args.steps) if name == "PPO" else args.steps
            settings = {"env": "CartPole-v1", "seed": seed, **(overrides if name == "GRPO" else {})}
            out = learning_curve(preset, settings, steps, args.eval_every, 475)
            results[name].append(out)
            ok &= out["eval"] >= 475 or name == "PPO"
            print(curve_row(name, seed, out, 475), flush=True)
    report_curves(results, args.seeds, args.plot, "CartPole-v1: GRPO vs PPO, library defaults", 475)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
