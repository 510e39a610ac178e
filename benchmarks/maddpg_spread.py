"""MADDPG against MAPPO on mpe2's simple_spread_v3 (3 agents cover 3 landmarks, 25-step episodes).

MADDPG runs its defaults (decentralized Gumbel-Softmax actors, one centralized critic shared by the
agents' policy); MAPPO is PPO with configs/ppo/pettingzoo-mpe2.simple_spread_v3.yaml (the MAPPO
paper's MPE settings) and its centralized critic (``central_critic=team_obs``). For each and each
seed: train for --steps env steps, evaluating 10 deterministic episodes every --eval-every steps
(the curve), then 20 at the end. The
return is the team's: the sum of the 3 agents' rewards over the episode (a random policy: about
-115). "first >= -60" is the env steps at which an evaluation first reached -60.

    python benchmarks/maddpg_spread.py [--seeds 1 2 3] [--steps 100000] [--jobs 2] [--plot curves.png]
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import shoal
from shoal.bench import curve_header, curve_row, learning_curve, report_curves, seed_sweep_args
from shoal.config import load_yaml, merge_settings

LEVEL = -60.0
ENV = {"env": "pettingzoo:mpe2.simple_spread_v3", "env_config": {"max_cycles": 25, "continuous_actions": False}}
MAPPO = load_yaml(Path(__file__).resolve().parent.parent / "configs" / "ppo" / "pettingzoo-mpe2.simple_spread_v3.yaml")
MAPPO.pop("total_timesteps")
RUNS = {
    "MADDPG": (shoal.MADDPG, ENV),
    "MAPPO": (shoal.PPO, {**MAPPO, "central_critic": "team_obs"}),
}


def main() -> int:
    args, overrides = seed_sweep_args(
        __doc__, steps=(int, 100_000), eval_every=(int, 10_000), jobs=(int, 1), plot=(str, None)
    )
    runs = [(name, seed) for name in RUNS for seed in args.seeds]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(
                learning_curve,
                RUNS[name][0],
                merge_settings({**RUNS[name][1], "seed": seed}, overrides),
                args.steps,
                args.eval_every,
                LEVEL,
            )
            for name, seed in runs
        ]
        print(curve_header(LEVEL))
        results: dict[str, list[dict]] = {name: [] for name in RUNS}
        for (name, seed), future in zip(runs, futures):
            out = future.result()
            results[name].append(out)
            print(curve_row(name, seed, out, LEVEL), flush=True)
    report_curves(results, args.seeds, args.plot, "simple_spread_v3: MADDPG vs MAPPO (team return)", LEVEL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
