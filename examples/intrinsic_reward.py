"""A count-based exploration bonus, added to the rewards through ``on_postprocess_trajectory``.

``SparseChain-v0`` (``shoal.envs.examples``) is a corridor with a small reward one step to the
left and a large one far to the right. PPO alone soon settles for the small one. ``CountBonus``
adds ``beta / sqrt(n)`` to the reward of every step, where ``n`` counts the visits to the step's
observation so far: rarely seen cells pay, which draws the policy down the corridor until it finds
the large reward. Only the learning signal changes; the logged returns stay the env's own.

    python examples/intrinsic_reward.py [total_timesteps]
    shoal train shoal.envs.examples:SparseChain-v0 callbacks='["examples.intrinsic_reward:CountBonus"]'

``benchmarks/intrinsic_reward.py`` compares 3 seeds with and without the bonus.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

import shoal


class CountBonus(shoal.Callback):
    """Adds ``beta / sqrt(visits)`` of each step's observation to its reward before PPO computes
    advantages. Counts are kept per observation value, which suits envs with few distinct ones."""

    def __init__(self, beta: float = 0.1):
        self.beta = beta
        self.visits: Counter[bytes] = Counter()

    def on_postprocess_trajectory(self, trainer: shoal.Trainer, trajectory: shoal.Trajectory) -> None:
        steps = trajectory.rollout[:, :-1]  # the transitions; slot T holds the last observation only
        obs = steps["obs"][trajectory.mask]
        seen, which = torch.unique(obs, dim=0, return_inverse=True)
        keys = [row.numpy().tobytes() for row in seen]  # a handful of distinct observations per rollout
        self.visits.update(dict(zip(keys, torch.bincount(which).tolist())))
        visits = torch.tensor([self.visits[key] for key in keys], dtype=torch.float32)
        reward = steps["reward"]
        reward[trajectory.mask] += self.beta / visits.sqrt()[which]


if __name__ == "__main__":
    import shoal.envs.examples  # registers SparseChain-v0

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with shoal.PPO(env="SparseChain-v0", callbacks=[CountBonus()], seed=1, save_outputs=False) as algo:
        algo.learn(steps)
        print(algo.evaluate(10))
