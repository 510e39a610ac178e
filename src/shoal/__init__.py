"""shoal: reinforcement learning at speed, one flat agent batch from env to loss."""

from shoal.algos import Algorithm, register_algorithm
from shoal.collect.episodes import Episode
from shoal.collect.policies import EpisodeStart
from shoal.config import DQNConfig, GRPOConfig, MADDPGConfig, PPOConfig, SACConfig, TD3Config, TrainerConfig
from shoal.envs import register_env
from shoal.envs.multi_agent import MultiAgentEnv
from shoal.envs.native import AgentEnv
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError, EnvError, ShoalError
from shoal.experiments import run_experiments
from shoal.models.policy import ActorCriticPolicy, Policy
from shoal.models.recurrent import RecurrentActorCriticPolicy
from shoal.presets import DQN, GRPO, MADDPG, PPO, SAC, TD3
from shoal.train import Trainer
from shoal.train.callbacks import Callback
from shoal.train.checkpoint import CheckpointError
from shoal.vector import make_backend

__version__ = "0.1.0"

__all__ = [
    "DQN",
    "GRPO",
    "MADDPG",
    "PPO",
    "SAC",
    "TD3",
    "ActorCriticPolicy",
    "AgentEnv",
    "Algorithm",
    "Callback",
    "CheckpointError",
    "ConfigError",
    "DQNConfig",
    "EnvError",
    "EnvInfo",
    "Episode",
    "EpisodeStart",
    "GRPOConfig",
    "MADDPGConfig",
    "MultiAgentEnv",
    "PPOConfig",
    "Policy",
    "RecurrentActorCriticPolicy",
    "SACConfig",
    "ShoalError",
    "TD3Config",
    "Trainer",
    "TrainerConfig",
    "make_backend",
    "register_algorithm",
    "register_env",
    "run_experiments",
]
