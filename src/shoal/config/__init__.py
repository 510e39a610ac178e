"""Configuration: one pydantic model per algorithm, the same keys in Python, YAML and on the command line.

``TrainerConfig`` holds the keys every algorithm shares (``shoal.config.trainer``, with the YAML and
``key=value`` readers); ``PPOConfig`` and ``GRPOConfig`` add their own (``shoal.config.algorithms``), the replay
learners theirs (``shoal.config.replay``);
``BatchLayout`` says what the batch keys add up to (``shoal.config.layout``).
"""

from shoal.config.algorithms import GRPOConfig, PPOConfig, SurrogateConfig, declared_episode_steps
from shoal.config.layout import BatchLayout
from shoal.config.replay import DQNConfig, OffPolicyConfig
from shoal.config.trainer import TrainerConfig, load_yaml, merge_settings, parse_overrides

__all__ = [
    "BatchLayout",
    "DQNConfig",
    "GRPOConfig",
    "OffPolicyConfig",
    "PPOConfig",
    "SurrogateConfig",
    "TrainerConfig",
    "declared_episode_steps",
    "load_yaml",
    "merge_settings",
    "parse_overrides",
]
