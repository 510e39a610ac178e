"""TD3 (Fujimoto et al. 2018, arXiv:1802.09477): a deterministic actor for Box actions with twin critics, target
policy smoothing and delayed actor updates.

Each minibatch step of a trained policy:

    critic: minimize 0.5 * sum_k (Q_k(s, a) - y)^2,  y = r + discount * min_k Q_target_k(s', a'),
            a' = clip(mu_target(s') + clip(noise, -c, c), -1, 1)     (target smoothing)
    every policy_delay critic steps:
        actor:   maximize Q_1(s, mu(s))
        targets: mu_target, Q_target <- tau * online + (1 - tau) * target

with ``r`` the n-step reward sum and ``discount`` ``gamma ** n`` (0 after a terminal step). Actions
are unit actions (see ``shoal.models.actors``), so the noise scales are shares of the half range.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from shoal.algos.critics import ReplayActorCritic, TargetActorLearner
from shoal.algos.off_policy import bootstrapped
from shoal.config.sac import TD3Config
from shoal.models.actors import DeterministicPolicy, QTowers, build_bounded_policy


class TD3Algorithm(ReplayActorCritic[TD3Config, DeterministicPolicy, "TD3Learner"]):
    name = "TD3"
    config_class = TD3Config
    STAT_NAMES = ("critic_loss", "actor_loss", "q_mean")
    HIDDENS = (400, 300)

    def make_policy(self, policy_id: str, config: TD3Config) -> DeterministicPolicy:
        """A deterministic tanh actor exploring with the policy's ``exploration_noise``."""
        policy = build_bounded_policy(config, self.env, self.HIDDENS, config.exploration_noise, config.noise_type)
        assert isinstance(policy, DeterministicPolicy)  # the builder's actor with exploration noise
        return policy

    def make_learner(self, policy_id: str, config: TD3Config) -> TD3Learner:
        return TD3Learner(self.policies[policy_id], self.critic(policy_id), config)


class TD3Learner(TargetActorLearner):
    """One policy's twin critics, target actor and the minibatch step the module describes."""

    policy: DeterministicPolicy
    config: TD3Config

    def __init__(self, policy: DeterministicPolicy, critic: QTowers, config: TD3Config):
        super().__init__(policy, critic, config)
        self.critic_steps = 0
        self.actor_loss = torch.zeros((), device=policy.center.device)
        """The latest actor step's loss (reported at every step; the actor steps every policy_delay)."""

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        policy, critic, c = self.policy, self.critic, self.config
        x, next_x = policy.features(batch["obs"]), policy.features(batch["next_obs"])
        target = self.td_target(batch, next_x)
        critic_loss, q, td_error = critic.learn(x, policy.critic_input(batch["action"]), target, weights)
        self.critic_steps += 1
        if self.critic_steps % c.policy_delay == 0:
            with critic.frozen():
                actor_loss = -critic.first(x, policy.critic_action(x)).mean()  # Q_1 alone, as TD3 does
            self.step_actor(actor_loss)
            self.update_targets()
            self.actor_loss = actor_loss.detach()
        return {"critic_loss": critic_loss, "actor_loss": self.actor_loss, "q_mean": q.mean()}, td_error

    @torch.no_grad()
    def td_target(self, batch: TensorDict, next_x: torch.Tensor) -> torch.Tensor:
        """``r + discount * min_k Q_target_k(s', a')`` with the smoothed target action ``a'``."""
        c = self.config
        next_action = self.policy.critic_action(next_x, self.actor_target.module)
        noise = torch.randn_like(next_action).mul_(c.target_policy_noise)
        next_action.add_(noise.clamp_(-c.target_noise_clip, c.target_noise_clip)).clamp_(-1.0, 1.0)
        return bootstrapped(batch, self.critic.target_min(next_x, next_action))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"critic_steps": self.critic_steps, "actor_loss": self.actor_loss}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critic_steps, self.actor_loss = state["critic_steps"], state["actor_loss"]
