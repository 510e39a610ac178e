"""The algorithms users construct by name: ``shoal.PPO(env=...)`` is ``shoal.Trainer(algo="ppo", env=...)``,
and likewise ``shoal.GRPO`` and ``shoal.DQN``."""

from __future__ import annotations

from shoal.train.trainer import Trainer


class PPO(Trainer):
    """Proximal Policy Optimization.

    >>> algo = shoal.PPO(env="CartPole-v1", seed=1)
    >>> algo.learn(100_000)
    >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "ppo"


class GRPO(Trainer):
    """Group Relative Policy Optimization: critic-free, each episode's return compared with those of
    its group (episodes from the same reset seed).

    >>> algo = shoal.GRPO(env="CartPole-v1", seed=1)
    >>> algo.learn(300_000)
    >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "grpo"


class DQN(Trainer):
    """Deep Q-learning for Discrete actions, with double Q, dueling heads, n-step returns and
    prioritized replay on request.

    >>> algo = shoal.DQN(env="CartPole-v1", seed=1)
    >>> algo.learn(50_000)
    >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "dqn"
