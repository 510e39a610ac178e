"""A policy network of your own: any ``torch.nn.Module`` that returns ``(dist_inputs, value)``.

shoal builds it as ``Model(obs_space, action_space, num_outputs, **model_config)`` and checks it
once on sample observations before training. Here: separate actor and critic towers on CartPole.

    python examples/custom_model.py [total_timesteps]
"""

from __future__ import annotations

import sys

import gymnasium as gym
import torch
from torch import nn

import shoal


# --8<-- [start:model]
class TwoTowers(nn.Module):
    def __init__(self, obs_space: gym.spaces.Box, action_space: gym.Space, num_outputs: int, hidden: int = 64):
        super().__init__()
        n = obs_space.shape[0]
        self.actor = nn.Sequential(nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, num_outputs))
        self.critic = nn.Sequential(nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)  # logits [B, 2], value [B]


# --8<-- [end:model]


if __name__ == "__main__":
    total_timesteps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with shoal.PPO(env="CartPole-v1", model=TwoTowers, model_config={"hidden": 64}, seed=1) as algo:
        algo.learn(total_timesteps)
        print(algo.evaluate(20))
