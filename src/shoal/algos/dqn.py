"""DQN (Mnih et al. 2015) with the usual improvements: double Q-learning (van Hasselt et al. 2016),
dueling heads (Wang et al. 2016), n-step returns and prioritized replay (Schaul et al. 2016).

Each trained policy's learner minimizes the Huber loss between ``Q(s, a)`` and the target

    y = R_n + discount * max_a' Q_target(s_n, a')    (double_q: Q_target(s_n, argmax_a' Q(s_n, a')))

over minibatches from the replay buffer, where ``R_n`` is the n-step discounted reward sum and
``discount`` is ``gamma ** n`` (0 after a terminal step; see ``ReplayBuffer.gather``). The next
action is chosen among the legal actions when the env masks them. The target network is a copy
of the Q-network, moved toward it by ``tau`` every ``target_update_interval`` env steps; the
policy acts epsilon-greedily with epsilon annealed linearly over ``exploration_fraction`` of each
``learn()`` call.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from shoal.algos.base import Collector
from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.algos.optim import AutogradOptimizer
from shoal.config import DQNConfig, OffPolicyConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.models.catalog import build_q_policy
from shoal.models.qpolicy import QPolicy, greedy


class DQNAlgorithm(OffPolicyAlgorithm):
    name = "DQN"
    config_class = DQNConfig
    STAT_NAMES = ("loss", "q_mean", "td_error")

    config: DQNConfig  # built from config_class by the trainer

    def __init__(self, config: DQNConfig, env: EnvInfo):
        super().__init__(config, env)
        self.epsilon = config.exploration_initial_eps

    def make_policy(self, policy_id: str, config: TrainerConfig) -> QPolicy:
        """An epsilon-greedy Q-network policy: ``model`` with one output per action."""
        return build_q_policy(config, self.env, cast(DQNConfig, config).dueling)

    def make_learner(self, policy_id: str, config: OffPolicyConfig) -> DQNLearner:
        return DQNLearner(cast(QPolicy, self.policies[policy_id]), cast(DQNConfig, config))

    def before_phase(self, progress: float) -> None:
        c = self.config
        share = min(progress / c.exploration_fraction, 1.0) if c.exploration_fraction else 1.0
        self.epsilon = c.exploration_initial_eps + share * (c.exploration_final_eps - c.exploration_initial_eps)
        for policy in self.policies.values():
            cast(QPolicy, policy).epsilon = self.epsilon
        for learner in self.learners.values():
            dqn = cast(DQNLearner, learner)
            dqn.optimizer.lr = self.learning_rate(dqn.config)  # the policy's own learning_rate

    def after_phase(self, steps_before: int) -> None:
        """Target updates due in the phase: ``k`` of them move the target as one update with
        ``1 - (1 - tau) ** k``."""
        interval = self.config.target_update_interval
        due = self.timesteps // interval - steps_before // interval
        if due:
            tau = 1.0 - (1.0 - self.config.tau) ** due
            for learner in self.learners.values():
                cast(DQNLearner, learner).update_target(tau)

    def training_step(self, collector: Collector) -> dict[str, Any]:
        return super().training_step(collector) | {"epsilon": self.epsilon}

    def describe(self) -> str:
        c = self.config
        return (
            f"replay: {c.buffer_size} steps; phases of {c.train_batch_size} env steps, each then {c.gradient_steps} "
            f"minibatches of {c.sgd_minibatch_size} (after {c.learning_starts} steps)"
        )


class DQNLearner:
    """One Q-network's target copy, optimizer and minibatch step."""

    def __init__(self, policy: QPolicy, config: DQNConfig):
        self.policy, self.config = policy, config
        self.target = copy.deepcopy(policy.model).requires_grad_(False)
        self.optimizer = AutogradOptimizer(policy, config.learning_rate, config.adam_eps, config.max_grad_norm)

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        policy = self.policy
        with torch.no_grad():
            next_mask = batch.get("next_action_mask", None)
            next_q = policy.q_values(batch["next_obs"], self.target)
            chooser = policy.q_values(batch["next_obs"]) if self.config.double_q else next_q
            best = next_q.gather(1, greedy(chooser, next_mask).unsqueeze(1)).squeeze(1)
            discount = batch["discount"]
            target = batch["reward"] + torch.where(discount > 0, discount * best, 0.0)
        q = policy.q_values(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target, reduction="none")
        loss = loss.mean() if weights is None else (weights * loss).mean()
        self.optimizer.backward(loss)
        self.optimizer.step()
        td_error = (q.detach() - target).abs()
        return torch.stack([loss.detach(), q.detach().mean(), td_error.mean()]), td_error

    @torch.no_grad()
    def update_target(self, tau: float) -> None:
        """``target <- tau * online + (1 - tau) * target`` (a copy when ``tau`` is 1)."""
        online = self.policy.model.state_dict()
        for key, value in self.target.state_dict().items():
            if tau < 1.0 and value.is_floating_point():
                value.lerp_(online[key], tau)
            else:
                value.copy_(online[key])

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "target": self.target.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.target.load_state_dict(state["target"])
