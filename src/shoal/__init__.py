"""shoal: reinforcement learning at speed, one flat agent batch from env to loss."""

from shoal.config import PPOConfig, TrainerConfig
from shoal.envs import register_env
from shoal.envs.multi_agent import MultiAgentEnv
from shoal.envs.native import AgentEnv
from shoal.errors import ConfigError, EnvError, ShoalError
from shoal.collect.episodes import Episode
from shoal.train import PPO, Trainer
from shoal.train.callbacks import Callback
from shoal.train.checkpoint import CheckpointError
from shoal.vector import make_backend

__version__ = "0.1.0"

__all__ = ["PPO", "AgentEnv", "Callback", "CheckpointError", "ConfigError", "EnvError", "Episode", "MultiAgentEnv",
           "PPOConfig", "ShoalError", "Trainer", "TrainerConfig", "make_backend", "register_env"]
