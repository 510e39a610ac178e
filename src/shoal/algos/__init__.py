"""Learning algorithms: pure RL math (advantages, losses) and each ``Algorithm``."""

from shoal.algos.advantages import gae
from shoal.algos.base import Algorithm, Trajectory
from shoal.algos.dqn import DQNAlgorithm
from shoal.algos.grpo import GRPOAlgorithm
from shoal.algos.maddpg import MADDPGAlgorithm
from shoal.algos.ppo import PPOAlgorithm
from shoal.algos.registry import ALGORITHMS, algorithm_class, register_algorithm
from shoal.algos.sac import SACAlgorithm
from shoal.algos.td3 import TD3Algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "DQNAlgorithm",
    "GRPOAlgorithm",
    "MADDPGAlgorithm",
    "PPOAlgorithm",
    "SACAlgorithm",
    "TD3Algorithm",
    "Trajectory",
    "algorithm_class",
    "gae",
    "register_algorithm",
]
