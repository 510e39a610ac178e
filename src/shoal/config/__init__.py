"""Configuration: one pydantic model per algorithm, the same keys in Python, YAML and on the command line.

``TrainerConfig`` holds the keys every algorithm shares (``shoal.config.trainer``, with the YAML and
``key=value`` readers); ``PPOConfig`` and ``GRPOConfig`` add their own (``shoal.config.algorithms``), the replay
learners theirs (``shoal.config.replay``, ``shoal.config.sac`` and ``shoal.config.maddpg``);
``BatchLayout`` says what the batch keys add up to (``shoal.config.layout``).
"""

from shoal.config.algorithms import GRPOConfig, PPOConfig, SurrogateConfig
from shoal.config.files import load_yaml, merge_settings, parse_overrides
from shoal.config.layout import BatchLayout
from shoal.config.maddpg import MADDPGConfig
from shoal.config.replay import DQNConfig, OffPolicyConfig
from shoal.config.sac import ReplayActorCriticConfig, SACConfig, TD3Config
from shoal.config.trainer import TrainerConfig
from shoal.envs.horizon import declared_episode_steps

__all__ = [
    "BatchLayout",
    "DQNConfig",
    "GRPOConfig",
    "MADDPGConfig",
    "OffPolicyConfig",
    "PPOConfig",
    "ReplayActorCriticConfig",
    "SACConfig",
    "SurrogateConfig",
    "TD3Config",
    "TrainerConfig",
    "declared_episode_steps",
    "load_yaml",
    "merge_settings",
    "parse_overrides",
]
