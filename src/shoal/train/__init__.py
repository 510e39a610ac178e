"""The training loop and the algorithms users construct."""

from shoal.train.ppo import PPO
from shoal.train.trainer import Trainer

__all__ = ["PPO", "Trainer"]
