"""MADDPG's keys."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from shoal.config.sac import DeterministicActorConfig


class MADDPGConfig(DeterministicActorConfig):
    """MADDPG's keys (and the replay keys of `OffPolicyConfig`). Defaults follow the MADDPG paper's particle-env
    settings (Lowe et al. 2017) in the network (2-layer 64-unit ReLU actors and critics), gamma 0.95, targets moved
    1% per step, minibatches of 1024 steps and gradients clipped to norm 0.5; they take a minibatch step every 8 env
    steps (8 envs, 25-step phases, 25 steps each) at step size 1e-3 where the paper takes one every 100 at 1e-2,
    which learns simple_spread far sooner (the paper trains for 25k episodes and more)."""

    READS_DATASETS: ClassVar[bool] = False  # its critics learn from all agents of an env at once, not one policy

    gumbel_temperature: float = Field(default=1.0, gt=0.0)
    """Temperature of the Gumbel-Softmax relaxation through which a Discrete actor's gradient flows."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_envs": 8,
        "gamma": 0.95,
        "tau": 0.01,
        "max_grad_norm": 0.5,
        "rollout_fragment_length": 25,
        "gradient_steps": 25,
        "sgd_minibatch_size": 1024,
        "learning_starts": 2000,
    }
    NOTES: ClassVar[dict[str, str]] = {"sgd_minibatch_size": "MADDPG draws them from the buffer, each with its team's."}
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*DeterministicActorConfig.POLICY_KEYS, "gumbel_temperature")
