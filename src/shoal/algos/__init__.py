"""Pure RL math and the update step of each algorithm."""

from shoal.algos.advantages import gae
from shoal.algos.ppo import PPOLearner

__all__ = ["PPOLearner", "gae"]
