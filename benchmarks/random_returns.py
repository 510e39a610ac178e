"""The mean return of uniformly random actions on the envs of shoal's reference table
(``configs/references.yaml``, under ``random``): the floor a negative-return task is judged from.

    python benchmarks/random_returns.py [--episodes 100] [--env ID ...]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import shoal  # noqa: F401 (registers shoal's envs, and MinAtar's ids when installed)
from shoal.benchmark.references import load_references


def random_return(env_id: str, episodes: int, seed: int = 0) -> tuple[float, float]:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--env", nargs="+", help="Gymnasium env ids (default: those under 'random' in the file)")
    args = parser.parse_args()
    envs = args.env or sorted(load_references().random)
    print(f"| env | random return ({args.episodes} episodes, seeds 0..{args.episodes - 1}) |\n|---|---|")
    for env_id in envs:
        mean, std = random_return(env_id, args.episodes)
        print(f"| {env_id} | {mean:.1f} ± {std:.1f} |", flush=True)


if __name__ == "__main__":
    main()
