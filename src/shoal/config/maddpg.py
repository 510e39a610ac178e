"""MADDPG's keys."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from shoal.config.replay import OffPolicyConfig
from shoal.config.sac import ReplayActorCriticConfig


class MADDPGConfig(ReplayActorCriticConfig):
    """MADDPG's keys (and the replay keys of `OffPolicyConfig`). Defaults follow the MADDPG paper's particle-env
    settings (Lowe et al. 2017) in the network (2-layer 64-unit ReLU actors and critics), gamma 0.95, targets moved
    1% per step, minibatches of 1024 steps and gradients clipped to norm 0.5; they take a minibatch step every 8 env
    steps (8 envs, 25-step phases, 25 steps each) at step size 1e-3 where the paper takes one every 100 at 1e-2,
    which learns simple_spread far sooner (the paper trains for 25k episodes and more)."""

    num_envs: int = Field(default=8, ge=1)
    """Environments stepped together; each brings its agents as rows of the batch."""
    gamma: float = Field(default=0.95, ge=0.0, le=1.0)
    """Discount factor of future rewards."""
    learning_rate: float = Field(default=1e-3, gt=0.0)
    """Adam's step size for the actors and critics (annealed as `lr_schedule` says)."""
    tau: float = Field(default=0.01, gt=0.0, le=1.0)
    """Target network update after each minibatch step: `target <- tau * online + (1 - tau) * target`."""
    max_grad_norm: float | None = Field(default=0.5, gt=0.0)
    """Clip the global norm of each step's gradient to this; None: no clipping."""
    rollout_fragment_length: int | None = Field(default=25, ge=1)
    """Steps of every env per collection phase (also written `train_freq`): each phase is followed by
    `gradient_steps` minibatch steps."""
    gradient_steps: int = Field(default=25, ge=-1)
    """Minibatch steps after each collection phase; -1: as many as the env steps the phase collected."""
    sgd_minibatch_size: int = Field(default=1024, ge=1)
    """Agent steps per minibatch drawn from the buffer (also written `minibatch_size`), each with its team's."""
    learning_starts: int = Field(default=2000, ge=0)
    """Env steps collected (acting uniformly at random) before the first gradient step."""
    gumbel_temperature: float = Field(default=1.0, gt=0.0)
    """Temperature of the Gumbel-Softmax relaxation through which a Discrete actor's gradient flows."""
    exploration_noise: float = Field(default=0.1, ge=0.0)
    """For Box actions: std of the Gaussian noise added to the actor's actions when collecting, as a share of the
    half range."""

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OffPolicyConfig.POLICY_KEYS, "exploration_noise", "gumbel_temperature")
