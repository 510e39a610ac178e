"""The keys of the replay actor-critics: those SAC, TD3 and MADDPG share, those of the deterministic
actors (TD3 and MADDPG), and SAC's and TD3's own."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.replay import OffPolicyConfig
from shoal.config.sde import StateDependentExplorationConfig
from shoal.errors import ConfigError


class ReplayActorCriticConfig(OffPolicyConfig):
    """Keys SAC, TD3 and MADDPG share. Defaults are Stable-Baselines3's: one env, a minibatch step of 256 after every
    env step from the 100th on, targets moved 0.5% toward the critics at each step."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"num_envs": 1, "gamma": 0.99, "tau": 0.005, "max_grad_norm": None}
    NOTES: ClassVar[dict[str, str]] = {
        "tau": "The actor-critics move their targets after each critic step (TD3: after each actor step, "
        "`policy_delay`)."
    }

    @model_validator(mode="after")
    def _check_action_rules(self) -> ReplayActorCriticConfig:
        if self.normalize_actions or not self.clip_actions:
            raise ConfigError(
                f"normalize_actions={self.normalize_actions}, clip_actions={self.clip_actions}: SAC, TD3 and MADDPG "
                f"always act in [-1, 1] and rescale to the bounds themselves; leave both keys at their defaults."
            )
        return self


class SACConfig(ReplayActorCriticConfig, StateDependentExplorationConfig):
    """SAC's keys (and the replay keys of `OffPolicyConfig`). Defaults are Stable-Baselines3's: a 2-layer 256-unit
    ReLU actor and twin critics, step size 3e-4, the entropy coefficient tuned toward an entropy of
    `-action_dims`."""

    entropy_coeff: Annotated[float, Field(ge=0.0)] | Literal["auto"] = "auto"
    """The weight `alpha` of the entropy bonus, fixed (0: none); `auto`: learned, so the policy's entropy tracks
    `target_entropy` (Haarnoja et al. 2018b)."""
    initial_entropy_coeff: float = Field(default=1.0, gt=0.0)
    """Where a learned entropy coefficient (`entropy_coeff=auto`) starts."""
    target_entropy: float | Literal["auto"] = "auto"
    """The entropy a learned coefficient aims at; `auto`: minus the number of action dimensions."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"learning_rate": 3e-4, "log_std_init": -3.0}
    NOTES: ClassVar[dict[str, str]] = {
        "learning_rate": "SAC: the learned entropy coefficient's too.",
        "log_std_init": "SAC reads it only with `use_sde` (its plain actor learns a std per state): where gSDE's "
        "std matrix starts, as in Stable-Baselines3's SAC.",
    }
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (
        *OffPolicyConfig.POLICY_KEYS,
        "entropy_coeff",
        "initial_entropy_coeff",
        "target_entropy",
    )


class DeterministicActorConfig(ReplayActorCriticConfig):
    """Keys TD3 and MADDPG share: their actors are deterministic (DDPG's), and explore with Gaussian noise."""

    exploration_noise: float = Field(default=0.1, ge=0.0)
    """Scale of the noise added to the actor's Box actions when collecting, as a share of the half range: the
    Gaussian's std, or the Ornstein-Uhlenbeck process's sigma."""
    noise_type: Literal["normal", "ornstein-uhlenbeck"] = "normal"
    """`normal`: Gaussian noise drawn afresh at every step; `ornstein-uhlenbeck`: each agent row's noise follows an
    Ornstein-Uhlenbeck process from 0 at each episode start (theta 0.15, dt 0.01, as Stable-Baselines3's), so
    successive pushes are correlated (rl-baselines3-zoo's `noise_type`)."""

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OffPolicyConfig.POLICY_KEYS, "exploration_noise", "noise_type")


class TD3Config(DeterministicActorConfig):
    """TD3's keys (and the replay keys of `OffPolicyConfig`). Defaults are Stable-Baselines3's (Fujimoto et al.
    2018): a 400- and 300-unit ReLU actor and twin critics, step size 1e-3, the actor and the targets updated every
    second critic step; plus exploration noise of 0.1 of the half range, as the TD3 paper and rl-baselines3-zoo
    use (Stable-Baselines3 adds none unless asked)."""

    policy_delay: int = Field(default=2, ge=1)
    """Critic steps per actor step; the target networks move at each actor step."""
    target_policy_noise: float = Field(default=0.2, ge=0.0)
    """Std of the noise added to the target actor's actions (target smoothing), as a share of the half range."""
    target_noise_clip: float = Field(default=0.5, ge=0.0)
    """The target smoothing noise is clipped to `[-target_noise_clip, target_noise_clip]`."""
