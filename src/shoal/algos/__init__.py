"""Learning algorithms: pure RL math (advantages, losses) and each ``Algorithm``."""

from shoal.algos.advantages import gae
from shoal.algos.base import Algorithm
from shoal.algos.dqn import DQNAlgorithm
from shoal.algos.grpo import GRPOAlgorithm
from shoal.algos.ppo import PPOAlgorithm
from shoal.algos.registry import ALGORITHMS, algorithm_class, register_algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "DQNAlgorithm",
    "GRPOAlgorithm",
    "PPOAlgorithm",
    "algorithm_class",
    "gae",
    "register_algorithm",
]
