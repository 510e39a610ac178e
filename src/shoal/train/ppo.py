"""``shoal.PPO``: the PPO trainer."""

from __future__ import annotations

import torch

from shoal.algos.ppo import PPOLearner
from shoal.config import PPOConfig
from shoal.train.trainer import Trainer


class PPO(Trainer):
    """Proximal Policy Optimization.

    >>> algo = PPO(env="CartPole-v1", seed=1)
    >>> algo.learn(100_000)
    >>> algo.evaluate(20)["episode_reward_mean"]
    """

    config_class = PPOConfig
    algo_name = "PPO"

    def _make_learner(self, policy, config: PPOConfig, index: int) -> PPOLearner:
        generator = torch.Generator().manual_seed(self.config.seed + index)
        return PPOLearner(policy, config, generator)
