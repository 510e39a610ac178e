"""Do the library defaults solve CartPole-v1? For each seed: PPO(env="CartPole-v1", seed=s).learn(100_000),
then 20 deterministic evaluation episodes; solved means a mean return >= 475.

    python benchmarks/solve_cartpole.py [--seeds 1 2 3] [--steps 100000] [key=value ...]

Config overrides ask the same of other settings, e.g. ``num_workers=2`` for the multiprocessing
backend or ``num_workers=2 async_factor=2`` for async rollouts.
"""

from __future__ import annotations

import sys
import time

import shoal
from shoal.bench import seed_sweep_args


def main() -> int:
    args, overrides = seed_sweep_args(__doc__, steps=(int, 100_000))
    print(f"{'seed':>4} {'steps':>8} {'wall (s)':>9} {'train return':>13} {'eval mean':>10} {'eval min':>9}  solved")
    ok = True
    for seed in args.seeds:
        start = time.perf_counter()
        with shoal.PPO(env="CartPole-v1", seed=seed, save_outputs=False, verbose=0, **overrides) as algo:
            result = algo.learn(args.steps)
            wall = time.perf_counter() - start
            ev = algo.evaluate(20)
        solved = ev["episode_reward_mean"] >= 475
        ok &= solved
        print(
            f"{seed:>4} {result['timesteps_total']:>8,} {wall:>9.1f} {result['episode_reward_mean']:>13.1f} "
            f"{ev['episode_reward_mean']:>10.1f} {ev['episode_reward_min']:>9.1f}  {'yes' if solved else 'NO'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
