"""The keys of the offline learners, which learn from recorded steps only (``input``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from shoal.config.replay import DQNConfig, OffPolicyConfig
from shoal.config.sac import SACConfig
from shoal.errors import ConfigError


class OfflineConfig(OffPolicyConfig):
    """Keys of the learners that read a dataset and never act in the envs (BC). A phase reads `train_freq` steps of
    each of `num_envs` rows of recorded episodes into the replay buffer, then takes `gradient_steps` minibatch steps;
    `total_timesteps` counts the recorded steps read (a dataset read again counts again)."""

    NEEDS_DATASET: ClassVar[bool] = True
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_envs": 1,
        "rollout_fragment_length": 1000,
        "gradient_steps": 100,
        "learning_starts": 1000,
        "buffer_size": 1_000_000,
        "max_grad_norm": None,
    }


class BCConfig(OfflineConfig):
    """Behaviour cloning's keys: only the shared ones (`OfflineConfig`). The default network is the built-in actor, a
    2-layer 64-unit tanh MLP, as for PPO."""


class MARWILConfig(OfflineConfig):
    """MARWIL's keys (Wang et al. 2018), named and defaulted as RLlib's: the recorded actions are imitated with weights
    `exp(beta * A / c)`, `A` the return-to-go minus the value, `c` the root of a running mean of `A^2`."""

    beta: float = Field(default=1.0, ge=0.0)
    """How strongly advantages weight the imitation; 0 is behaviour cloning (with a value function learned beside)."""
    vf_coeff: float = Field(default=1.0, ge=0.0)
    """Weight of the value function's loss `0.5 * A^2`."""
    moving_average_sqd_adv_norm_start: float = Field(default=100.0, gt=0.0)
    """Where the running mean of the squared advantages starts."""
    moving_average_sqd_adv_norm_update_rate: float = Field(default=1e-8, gt=0.0, le=1.0)
    """How fast that running mean follows each minibatch's mean squared advantage."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"learning_rate": 1e-4}
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OfflineConfig.POLICY_KEYS, "beta", "vf_coeff")


class CQLConfig(OfflineConfig, SACConfig, DQNConfig):
    """Conservative Q-learning's keys (Kumar et al. 2020): SAC's for Box actions, DQN's for Discrete ones, and the
    weight of the conservative term, which pushes down the values of actions the data did not take. Defaults follow
    the paper and RLlib (SAC's step size 3e-4, 10 sampled actions per state, weight 5 for Box actions; 1 for
    Discrete, as in the paper's Atari runs)."""

    min_q_weight: float | None = Field(default=None, ge=0.0)
    """Weight of the conservative term; None: 5.0 for Box actions, 1.0 for Discrete ones."""
    num_actions: int = Field(default=10, ge=1)
    """Box actions: actions drawn per state (uniformly, and from the policy at the state and at the next one) for the
    log-sum-exp of the conservative term."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Temperature of that log-sum-exp."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "learning_rate": 3e-4,
        "gamma": 0.99,
        "tau": 0.005,
        "target_update_interval": 1,
        "sgd_minibatch_size": 256,
        "max_grad_norm": None,
        "log_std_init": SACConfig.DEFAULTS["log_std_init"],  # SAC's, though without gSDE nothing reads it
    }
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*SACConfig.POLICY_KEYS, "min_q_weight")

    @model_validator(mode="after")
    def _check_no_sde(self) -> CQLConfig:
        if self.use_sde:
            raise ConfigError(
                "use_sde=True is an exploration method for collecting; CQL learns from a dataset and collects "
                "nothing (and its conservative term draws several actions per state, which one held noise matrix "
                "would make equal). Leave use_sde false."
            )
        return self
