"""``StateDependentExplorationConfig``: the gSDE keys of the Gaussian policies that have it (PPO, SAC)."""

from __future__ import annotations

from pydantic import Field, model_validator

from shoal.config.trainer import TrainerConfig
from shoal.errors import ConfigError, warn


class StateDependentExplorationConfig(TrainerConfig):
    """Keys of generalized state-dependent exploration (gSDE, Raffin et al. 2021), named as in Stable-Baselines3 and
    rl-baselines3-zoo: for Box actions, the exploration noise is a function of the policy's features held for several
    steps, rather than white noise drawn at every step."""

    use_sde: bool = False
    """Explore with gSDE: each agent row's action noise is `features(s) @ W`, with `W` drawn from `N(0, std^2)` at the
    start of every collection (each iteration's rollout, each replay phase) and every `sde_sample_freq` steps; the
    `std` matrix, `[features, action dims]`, starts at `exp(log_std_init)` and is learned. Box actions and the built-in
    feedforward models only."""
    sde_sample_freq: int = Field(default=-1, ge=-1)
    """With `use_sde`: steps of each row between draws of its noise matrix; -1 (or 0): once per collection only."""

    @model_validator(mode="after")
    def _check_sde(self) -> StateDependentExplorationConfig:
        if self.use_sde and self.recurrent:
            raise ConfigError(
                "use_sde=True reads the actor's last hidden layer, which the feedforward models expose; a recurrent "
                "core (model_config core) has none to give. Leave use_sde false, or drop the core."
            )
        if not self.use_sde and self.sde_sample_freq not in (-1, 0):
            warn(f"sde_sample_freq={self.sde_sample_freq} has no effect without use_sde=true.")
        if self.use_sde and self.batch_mode == "complete_episodes":
            raise ConfigError(
                "use_sde=True carries each row's noise matrix from step to step, and batch_mode='complete_episodes' "
                "steps rows past the rollout without carrying it; use batch_mode='truncate_episodes' with gSDE."
            )
        return self
