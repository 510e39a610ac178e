"""Configuration: one pydantic model per algorithm, the same keys in Python, YAML and on the command line.

``TrainerConfig`` holds the keys every algorithm shares (``shoal.config.trainer``); ``PPOConfig``,
``GRPOConfig`` and ``PQNConfig`` add their own (``shoal.config.algorithms``), the replay learners
theirs (``shoal.config.replay``, ``shoal.config.sac`` and ``shoal.config.maddpg``). Keys two
families share live in a class of their own: the epsilon-greedy exploration of DQN and PQN
(``shoal.config.exploration``) and gSDE of PPO and SAC (``shoal.config.sde``). Each key is declared
once; a family or algorithm that wants another default sets it in its ``DEFAULTS``
(``shoal.config.base``). YAML is read by ``shoal.yaml_io``, ``key=value`` pairs by
``shoal.config.files``; ``BatchLayout`` says what the batch keys add up to (``shoal.config.layout``).
"""

from shoal.config.algorithms import GRPOConfig, OnPolicyConfig, PPOConfig, PQNConfig, SurrogateConfig
from shoal.config.exploration import EpsilonGreedyConfig
from shoal.config.files import merge_settings, parse_overrides
from shoal.config.layout import BatchLayout
from shoal.config.maddpg import MADDPGConfig
from shoal.config.offline_learners import BCConfig, CQLConfig, MARWILConfig, OfflineConfig
from shoal.config.replay import DQNConfig, OffPolicyConfig
from shoal.config.sac import DeterministicActorConfig, ReplayActorCriticConfig, SACConfig, TD3Config
from shoal.config.sde import StateDependentExplorationConfig
from shoal.config.trainer import TrainerConfig
from shoal.envs.horizon import declared_episode_steps
from shoal.yaml_io import load_yaml

__all__ = [
    "BCConfig",
    "BatchLayout",
    "CQLConfig",
    "DQNConfig",
    "DeterministicActorConfig",
    "EpsilonGreedyConfig",
    "GRPOConfig",
    "MADDPGConfig",
    "MARWILConfig",
    "OffPolicyConfig",
    "OfflineConfig",
    "OnPolicyConfig",
    "PPOConfig",
    "PQNConfig",
    "ReplayActorCriticConfig",
    "SACConfig",
    "StateDependentExplorationConfig",
    "SurrogateConfig",
    "TD3Config",
    "TrainerConfig",
    "declared_episode_steps",
    "load_yaml",
    "merge_settings",
    "parse_overrides",
]
