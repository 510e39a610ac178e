"""Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1801.01290) for Box actions, with the entropy
coefficient learned toward a target entropy (Haarnoja et al. 2018b, arXiv:1812.05905).

Each minibatch step of a trained policy, in this order:

    alpha:  minimize -log(alpha) * (log pi(a|s) + target_entropy)        (when learned)
    critic: minimize 0.5 * sum_k (Q_k(s, a) - y)^2,
            y = r + discount * (min_k Q_target_k(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
    actor:  minimize alpha * log pi(a~|s) - min_k Q_k(s, a~),  a~ ~ pi(s) reparameterized
    target: Q_target <- tau * Q + (1 - tau) * Q_target

with ``r`` the n-step reward sum and ``discount`` ``gamma ** n`` (0 after a terminal step).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from shoal.algos.critics import ActorCriticLearner, ReplayActorCritic
from shoal.algos.off_policy import bootstrapped
from shoal.algos.optim import AutogradOptimizer
from shoal.config.sac import SACConfig
from shoal.models.actors import QTowers, SquashedGaussianPolicy, build_bounded_policy


class SACAlgorithm(ReplayActorCritic[SACConfig, SquashedGaussianPolicy, "SACLearner"]):
    name = "SAC"
    config_class = SACConfig
    STAT_NAMES = ("critic_loss", "actor_loss", "entropy_coeff", "q_mean", "entropy")

    def make_policy(self, policy_id: str, config: SACConfig) -> SquashedGaussianPolicy:
        """A tanh-squashed Gaussian actor (``model_config``'s ``hiddens``, else ``HIDDENS``)."""
        policy = build_bounded_policy(config, self.env, self.HIDDENS)
        assert isinstance(policy, SquashedGaussianPolicy)  # the builder's actor without exploration noise
        return policy

    def make_learner(self, policy_id: str, config: SACConfig) -> SACLearner:
        return SACLearner(self.policies[policy_id], self.critic(policy_id), config)


class SACLearner(ActorCriticLearner):
    """One policy's twin critics, entropy coefficient and the minibatch step the module describes."""

    policy: SquashedGaussianPolicy
    config: SACConfig

    def __init__(self, policy: SquashedGaussianPolicy, critic: QTowers, config: SACConfig):
        super().__init__(policy, critic, config)
        device = policy.center.device
        self.log_alpha: nn.Parameter | None = None
        """The learned coefficient's log (so it stays positive); None when ``entropy_coeff`` fixes it."""
        self.alpha_optimizer: AutogradOptimizer | None = None
        if config.entropy_coeff == "auto":
            self.log_alpha = nn.Parameter(torch.tensor(math.log(config.initial_entropy_coeff), device=device))
            self.alpha_optimizer = AutogradOptimizer(
                [self.log_alpha], config.learning_rate, config.adam_eps, None, policy.policy_id, "entropy coefficient"
            )
            self.optimizers.append(self.alpha_optimizer)
        self.fixed_alpha = torch.tensor(0.0 if self.log_alpha is not None else config.entropy_coeff, device=device)
        action_dims = policy.center.shape[0]
        self.target_entropy = -float(action_dims) if config.target_entropy == "auto" else config.target_entropy

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        policy, critic = self.policy, self.critic
        x, next_x = policy.features(batch["obs"]), policy.features(batch["next_obs"])
        action, log_prob = policy.sample(x)
        alpha = self.alpha()
        if self.log_alpha is not None and self.alpha_optimizer is not None:
            self.alpha_optimizer.backward(-(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean())
            self.alpha_optimizer.step()
        target = self.td_target(batch, next_x, alpha)
        data_action = policy.critic_input(batch["action"])
        penalty = self.critic_penalty(x, next_x, data_action)
        critic_loss, q, td_error = critic.learn(x, data_action, target, weights, penalty)
        with critic.frozen():
            actor_loss = (alpha * log_prob - critic.values(x, action).amin(0)).mean()
        self.step_actor(actor_loss)
        critic.target.update(self.config.tau)
        stats = {"critic_loss": critic_loss, "actor_loss": actor_loss.detach(), "entropy_coeff": alpha}
        return stats | {"q_mean": q.mean(), "entropy": -log_prob.detach().mean()}, td_error

    def critic_penalty(self, x: torch.Tensor, next_x: torch.Tensor, data_action: torch.Tensor) -> torch.Tensor | None:
        """A term added to the critics' loss (conservative Q-learning's); None: none."""
        return None

    def alpha(self) -> torch.Tensor:
        """The entropy coefficient: learned, or as ``entropy_coeff`` fixes it."""
        return self.fixed_alpha if self.log_alpha is None else self.log_alpha.detach().exp()

    @torch.no_grad()
    def td_target(self, batch: TensorDict, next_x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``r + discount * (min_k Q_target_k(s', a') - alpha * log pi(a'|s'))``, ``a' ~ pi(s')``."""
        next_action, next_log_prob = self.policy.sample(next_x)
        return bootstrapped(batch, self.critic.target_min(next_x, next_action) - alpha * next_log_prob)

    def state_dict(self) -> dict[str, Any]:
        if self.log_alpha is None or self.alpha_optimizer is None:
            return super().state_dict()
        return super().state_dict() | {
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.log_alpha is not None and self.alpha_optimizer is not None:
            with torch.no_grad():
                self.log_alpha.copy_(state["log_alpha"])
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
