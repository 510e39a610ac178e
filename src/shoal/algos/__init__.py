"""Learning algorithms: pure RL math (``returns``, ``losses``), the family bases (``on_policy``,
``off_policy``) and each ``Algorithm`` on its own page."""

from shoal.algos.base import Algorithm, Trajectory
from shoal.algos.dqn import DQNAlgorithm
from shoal.algos.grpo import GRPOAlgorithm
from shoal.algos.maddpg import MADDPGAlgorithm
from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.algos.on_policy import OnPolicyAlgorithm
from shoal.algos.ppo import PPOAlgorithm
from shoal.algos.ppo_segments import SegmentPPO
from shoal.algos.pqn import PQNAlgorithm
from shoal.algos.registry import ALGORITHMS, algorithm_class, register_algorithm
from shoal.algos.returns import gae
from shoal.algos.sac import SACAlgorithm
from shoal.algos.td3 import TD3Algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "DQNAlgorithm",
    "GRPOAlgorithm",
    "MADDPGAlgorithm",
    "OffPolicyAlgorithm",
    "OnPolicyAlgorithm",
    "PPOAlgorithm",
    "PQNAlgorithm",
    "SACAlgorithm",
    "SegmentPPO",
    "TD3Algorithm",
    "Trajectory",
    "algorithm_class",
    "gae",
    "register_algorithm",
]
