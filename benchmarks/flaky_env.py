"""Does PPO still solve CartPole-v1 when its env keeps crashing? Training runs on a CartPole whose
step raises on ``--fail-rate`` of the calls (default 1%, about a thousand crashes in 100k steps),
with ``restart_failed_envs=True``; the policy is then evaluated on the plain CartPole-v1 for 20
deterministic episodes. Solved means a mean return >= 475.

    python benchmarks/flaky_env.py [--seeds 1 2 3] [--steps 100000] [--fail-rate 0.01] [key=value ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np

import shoal
from shoal.bench import seed_sweep_args
from shoal.config import load_yaml
from shoal.config.tuned import tuned_path


class CrashingCartPole(gym.Wrapper):
    """CartPole-v1 whose step raises on ``rate`` of the calls, as a simulator that crashes would."""

    def __init__(self, env_config: dict[str, Any]):
        super().__init__(gym.make("CartPole-v1"))
        self.rate, self.rng = env_config["rate"], np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        if self.rng.random() < self.rate:
            raise RuntimeError("the simulator crashed")
        return self.env.step(action)


def evaluate(algo: shoal.Trainer, episodes: int = 20) -> list[float]:
    """Deterministic returns on the plain CartPole-v1 (the crashing one cannot be evaluated on)."""
    env, returns = gym.make("CartPole-v1"), []
    for episode in range(episodes):
        obs, _ = env.reset(seed=10_000 + episode)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(algo.compute_actions(obs, deterministic=True)))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def main() -> int:
    args, overrides = seed_sweep_args(__doc__, steps=(int, 100_000), fail_rate=(float, 0.01))
    tuned = load_yaml(cast(Path, tuned_path("ppo", "CartPole-v1")))  # the env is a class: no tuned config of its own
    settings = {key: value for key, value in tuned.items() if key not in ("algo", "env")} | overrides
    settings |= dict(env=CrashingCartPole, env_config={"rate": args.fail_rate}, restart_failed_envs=True)
    settings.setdefault("max_restarts_per_hour", 1_000_000)  # the crashes are the point here
    print(f"{'seed':>4} {'steps':>8} {'restarts':>9} {'wall (s)':>9} {'eval mean':>10} {'eval min':>9}  solved")
    ok = True
    for seed in args.seeds:
        start = time.perf_counter()
        with shoal.PPO(seed=seed, save_outputs=False, verbose=0, **settings) as algo:
            result = algo.learn(args.steps)
            wall = time.perf_counter() - start
            returns = evaluate(algo)
        solved = float(np.mean(returns)) >= 475
        ok &= solved
        print(
            f"{seed:>4} {result['timesteps_total']:>8,} {result['num_env_restarts']:>9,} {wall:>9.1f} "
            f"{np.mean(returns):>10.1f} {min(returns):>9.1f}  {'yes' if solved else 'NO'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
