"""shoal: reinforcement learning at speed, one flat agent batch from env to loss."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.algos import Algorithm, Trajectory, register_algorithm
    from shoal.collect.episodes import Episode
    from shoal.collect.policies import EpisodeStart
    from shoal.config import (
        BCConfig,
        CQLConfig,
        DQNConfig,
        GRPOConfig,
        MADDPGConfig,
        MARWILConfig,
        PPOConfig,
        PQNConfig,
        SACConfig,
        TD3Config,
        TrainerConfig,
    )
    from shoal.envs import register_env
    from shoal.envs.multi_agent import MultiAgentEnv
    from shoal.envs.native import AgentEnv
    from shoal.envs.spaces import EnvInfo
    from shoal.errors import ConfigError, EnvError, OutputError, ShoalError, ShoalWarning, TrainingDiverged
    from shoal.experiments import run_experiments
    from shoal.models.policy import ActorCriticPolicy, Policy
    from shoal.models.recurrent import RecurrentActorCriticPolicy
    from shoal.presets import BC, CQL, DQN, GRPO, MADDPG, MARWIL, PPO, PQN, SAC, TD3
    from shoal.train import Trainer
    from shoal.train.callbacks import Callback
    from shoal.train.checkpoint import CheckpointError
    from shoal.vector import make_backend

__version__ = "0.1.0"

# Names load on first use, so a light part (the policy server's client, `shoal --version`) can be
# imported without torch and the rest.
_MODULE_OF = {
    "Algorithm": "shoal.algos",
    "Trajectory": "shoal.algos",
    "register_algorithm": "shoal.algos",
    "Episode": "shoal.collect.episodes",
    "EpisodeStart": "shoal.collect.policies",
    "DQNConfig": "shoal.config",
    "GRPOConfig": "shoal.config",
    "MADDPGConfig": "shoal.config",
    "PPOConfig": "shoal.config",
    "PQNConfig": "shoal.config",
    "BCConfig": "shoal.config",
    "CQLConfig": "shoal.config",
    "MARWILConfig": "shoal.config",
    "SACConfig": "shoal.config",
    "TD3Config": "shoal.config",
    "TrainerConfig": "shoal.config",
    "register_env": "shoal.envs",
    "MultiAgentEnv": "shoal.envs.multi_agent",
    "AgentEnv": "shoal.envs.native",
    "EnvInfo": "shoal.envs.spaces",
    "ConfigError": "shoal.errors",
    "EnvError": "shoal.errors",
    "OutputError": "shoal.errors",
    "TrainingDiverged": "shoal.errors",
    "ShoalError": "shoal.errors",
    "ShoalWarning": "shoal.errors",
    "run_experiments": "shoal.experiments",
    "ActorCriticPolicy": "shoal.models.policy",
    "Policy": "shoal.models.policy",
    "RecurrentActorCriticPolicy": "shoal.models.recurrent",
    "DQN": "shoal.presets",
    "GRPO": "shoal.presets",
    "MADDPG": "shoal.presets",
    "PPO": "shoal.presets",
    "PQN": "shoal.presets",
    "BC": "shoal.presets",
    "CQL": "shoal.presets",
    "MARWIL": "shoal.presets",
    "SAC": "shoal.presets",
    "TD3": "shoal.presets",
    "Trainer": "shoal.train",
    "Callback": "shoal.train.callbacks",
    "CheckpointError": "shoal.train.checkpoint",
    "make_backend": "shoal.vector",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "BC",
    "CQL",
    "DQN",
    "GRPO",
    "MADDPG",
    "MARWIL",
    "PPO",
    "PQN",
    "SAC",
    "TD3",
    "ActorCriticPolicy",
    "AgentEnv",
    "Algorithm",
    "BCConfig",
    "CQLConfig",
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
    "MARWILConfig",
    "MultiAgentEnv",
    "OutputError",
    "PPOConfig",
    "PQNConfig",
    "Policy",
    "RecurrentActorCriticPolicy",
    "SACConfig",
    "ShoalError",
    "ShoalWarning",
    "TD3Config",
    "Trainer",
    "TrainerConfig",
    "TrainingDiverged",
    "Trajectory",
    "make_backend",
    "register_algorithm",
    "register_env",
    "run_experiments",
]
