"""The algorithms users construct by name: ``shoal.PPO(env=...)`` is ``shoal.Trainer(algo="ppo", env=...)``,
and likewise ``shoal.GRPO``, ``shoal.DQN``, ``shoal.PQN``, ``shoal.SAC``, ``shoal.TD3`` and ``shoal.MADDPG``."""

from __future__ import annotations

from shoal.train.trainer import Trainer


class PPO(Trainer):
    """Proximal Policy Optimization.

    Examples:
        >>> algo = shoal.PPO(env="CartPole-v1", seed=1)
        >>> algo.learn(100_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "ppo"


class GRPO(Trainer):
    """Group Relative Policy Optimization: critic-free, each episode's return compared with those of
    its group (episodes from the same reset seed).

    Examples:
        >>> algo = shoal.GRPO(env="CartPole-v1", seed=1)
        >>> algo.learn(300_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "grpo"


class DQN(Trainer):
    """Deep Q-learning for Discrete actions, with double Q, dueling heads, n-step returns and
    prioritized replay on request.

    Examples:
        >>> algo = shoal.DQN(env="CartPole-v1", seed=1)
        >>> algo.learn(50_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "dqn"


class PQN(Trainer):
    """Parallel Q-learning for Discrete actions: a LayerNorm Q-network learned on-policy from many
    envs with Q(lambda) returns, no replay buffer and no target network.

    Examples:
        >>> algo = shoal.PQN(env="CartPole-v1", seed=1)
        >>> algo.learn(100_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "pqn"


class SAC(Trainer):
    """Soft Actor-Critic for Box actions: a squashed Gaussian actor, twin critics and a learned
    entropy coefficient.

    Examples:
        >>> algo = shoal.SAC(env="Pendulum-v1", seed=1, learning_rate=1e-3)
        >>> algo.learn(20_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "sac"


class TD3(Trainer):
    """TD3 for Box actions: a deterministic actor with twin critics, target smoothing and delayed
    actor updates.

    Examples:
        >>> algo = shoal.TD3(env="Pendulum-v1", seed=1)
        >>> algo.learn(20_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "td3"


class MADDPG(Trainer):
    """MADDPG for multi-agent envs: decentralized actors trained against centralized critics that
    see every agent's observation and action (Gumbel-Softmax for Discrete actions).

    Examples:
        >>> algo = shoal.MADDPG(env="pettingzoo:mpe2.simple_spread_v3", env_config={"max_cycles": 25}, seed=1)
        >>> algo.learn(100_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "maddpg"


class BC(Trainer):
    """Behaviour cloning from recorded steps (``input``): the policy learns to take the recorded
    actions; the env is used for its spaces and for evaluation.

    Examples:
        >>> algo = shoal.BC(env="CartPole-v1", input="data/cartpole-expert", seed=1)
        >>> algo.learn(200_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "bc"


class MARWIL(Trainer):
    """MARWIL from recorded steps (``input``): imitation weighted by the exponentiated advantage of
    each recorded step over its state's value (Wang et al. 2018); ``beta=0`` is behaviour cloning.

    Examples:
        >>> algo = shoal.MARWIL(env="CartPole-v1", input="data/cartpole-mixed", seed=1)
        >>> algo.learn(200_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "marwil"


class CQL(Trainer):
    """Conservative Q-learning from recorded steps (``input``): DQN for Discrete actions, SAC for
    Box actions, with the values of actions the data did not take pushed down (Kumar et al. 2020).

    Examples:
        >>> algo = shoal.CQL(env="Pendulum-v1", input="data/pendulum-medium", seed=1)
        >>> algo.learn(200_000)
        >>> algo.evaluate(20)["episode_reward_mean"]
    """

    algo = "cql"
