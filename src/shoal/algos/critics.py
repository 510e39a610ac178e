"""What the replay actor-critics (SAC, TD3, MADDPG) share: critics with their targets
(``Critics``) and the algorithm around one learner per trained policy (``ReplayActorCritic``).

Twin critics (Fujimoto et al. 2018) learn two Q-functions side by side and bootstrap from the
smaller of their targets, which keeps the overestimation of a max over noisy values in check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from tensordict import TensorDict
from typing_extensions import TypeVar

from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.algos.optim import AutogradOptimizer, TargetNetwork
from shoal.config.sac import ReplayActorCriticConfig
from shoal.models.actors import QTowers, ReplayActorPolicy, build_critic


class Critics:
    """``k`` Q-networks ``Q_k(x, action)`` (``QTowers``; SAC and TD3 have twins, MADDPG one), their
    target copy and optimizer. ``x`` is what the critic sees besides the action (the features of
    one observation, or of a team's)."""

    def __init__(self, net: QTowers, config: ReplayActorCriticConfig, owner: str = ""):
        self.net, self.target = net, TargetNetwork(net)
        self.optimizer = AutogradOptimizer(
            net, config.learning_rate, config.adam_eps, config.max_grad_norm, owner, "critic"
        )

    def target_min(self, x: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        """The smallest of the target networks' values ``[B]`` (the value, for one network)."""
        values: torch.Tensor = self.target(torch.cat([x, unit_action], 1))
        return values.amin(0)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Within it, gradients flow through the critics to the actions only: an actor's loss then
        skips the critics' weight gradients, which its optimizer would not use."""
        params = self.optimizer.params
        try:  # the loop inside: interrupted half way, every parameter still gets its gradient back
            for p in params:
                p.requires_grad_(False)
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def values(self, x: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        """Every critic's values ``[k, B]``."""
        values: torch.Tensor = self.net(torch.cat([x, unit_action], 1))
        return values

    def first(self, x: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        """The first critic's values ``[B]`` alone."""
        return self.net.first(torch.cat([x, unit_action], 1))

    def learn(
        self,
        x: torch.Tensor,
        unit_action: torch.Tensor,
        target: torch.Tensor,
        weights: torch.Tensor | None,
        penalty: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on ``0.5 * sum_k (Q_k - target)^2`` (weighted by importance ``weights``) plus
        ``penalty`` when given (a term on the critics' values elsewhere, conservative Q-learning's);
        returns the loss, the values ``[k, B]`` and each step's TD error averaged over the critics."""
        q = self.values(x, unit_action)
        error = q - target
        loss = 0.5 * error.square().sum(0)
        loss = loss.mean() if weights is None else (weights * loss).mean()
        self.optimizer.backward(loss if penalty is None else loss + penalty)
        self.optimizer.step()
        return loss.detach(), q.detach(), error.detach().abs().mean(0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])


class ActorCriticLearner:
    """One policy's learner of a replay actor-critic: its critics (with targets) and the actor's
    optimizer; subclasses write ``learn(batch, weights)`` and add their own state."""

    def __init__(self, policy: ReplayActorPolicy, critic: QTowers, config: ReplayActorCriticConfig):
        self.policy, self.config = policy, config
        self.critic = Critics(critic, config, policy.policy_id)
        self.actor_optimizer = AutogradOptimizer(
            policy, config.learning_rate, config.adam_eps, config.max_grad_norm, policy.policy_id, "actor"
        )
        self.optimizers = [self.critic.optimizer, self.actor_optimizer]
        """Every optimizer the learner steps; the algorithm sets their step size before each phase."""

    def prepare(self, batch: TensorDict) -> TensorDict:
        """``batch`` as it is: every target here reads networks that change with each step."""
        return batch

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One minibatch step (``Learner.learn``), the algorithm's own."""
        raise NotImplementedError(f"{type(self).__name__} must implement learn(batch, weights)")

    def step_actor(self, loss: torch.Tensor) -> None:
        self.actor_optimizer.backward(loss)
        self.actor_optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])


class TargetActorLearner(ActorCriticLearner):
    """A learner whose actor has a target copy too (TD3, MADDPG), moved with the critics' targets."""

    def __init__(self, policy: ReplayActorPolicy, critic: QTowers, config: ReplayActorCriticConfig):
        super().__init__(policy, critic, config)
        self.actor_target = TargetNetwork(policy.actor)

    def update_targets(self) -> None:
        self.critic.target.update(self.config.tau)
        self.actor_target.update(self.config.tau)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"actor_target": self.actor_target.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.actor_target.load_state_dict(state["actor_target"])


ConfigT = TypeVar("ConfigT", bound=ReplayActorCriticConfig, default=ReplayActorCriticConfig)
ActorT = TypeVar("ActorT", bound=ReplayActorPolicy, default=ReplayActorPolicy)
LearnerT = TypeVar("LearnerT", bound=ActorCriticLearner, default=ActorCriticLearner)


class ReplayActorCritic(OffPolicyAlgorithm[ConfigT, ActorT, LearnerT]):
    """Base of SAC, TD3 and MADDPG: an actor per policy (``make_policy``), and a learner per trained policy
    with critics sized like the actor (``model_config``'s ``hiddens``, else ``HIDDENS``)."""

    config_class = ReplayActorCriticConfig
    HIDDENS: ClassVar[tuple[int, ...]] = (256, 256)
    """Hidden sizes of the actor and critics when ``model_config`` gives none."""

    def critic(self, policy_id: str) -> QTowers:
        return build_critic(self.policy_configs[policy_id], self.env, self.HIDDENS).to(self.config.device)

    def before_phase(self, progress: float) -> None:
        """The trained policies act uniformly at random until ``learning_starts`` env steps are in."""
        for pid in self.trained_policy_ids:  # a frozen policy (not trained) acts as it has learned
            self.policies[pid].random_actions = self.timesteps < self.config.learning_starts
        super().before_phase(progress)

    def make_policy(self, policy_id: str, config: ConfigT) -> ActorT:
        raise NotImplementedError
