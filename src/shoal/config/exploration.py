"""``EpsilonGreedyConfig``: the exploration keys of the Q-learners that act epsilon-greedily (DQN, PQN)."""

from __future__ import annotations

from pydantic import Field

from shoal.config.trainer import TrainerConfig


class EpsilonGreedyConfig(TrainerConfig):
    """Keys of the algorithms whose policy acts greedily on its Q-values, or at random with probability epsilon."""

    exploration_fraction: float = Field(default=0.16, ge=0.0, le=1.0)
    """Share of each `learn()` call over which epsilon falls linearly from `exploration_initial_eps` to
    `exploration_final_eps`."""
    exploration_initial_eps: float = Field(default=1.0, ge=0.0, le=1.0)
    """The probability of a random action at the start."""
    exploration_final_eps: float = Field(default=0.04, ge=0.0, le=1.0)
    """The probability of a random action once the exploration fraction has passed."""

    def epsilon(self, progress: float) -> float:
        """Epsilon at ``progress`` (0 to 1) through a ``learn()`` call."""
        share = min(progress / self.exploration_fraction, 1.0) if self.exploration_fraction else 1.0
        return self.exploration_initial_eps + share * (self.exploration_final_eps - self.exploration_initial_eps)
