"""Behaviour cloning: the policy learns to take the recorded actions (Pomerleau 1991; as a
baseline of offline RL, e.g. Fu et al. 2020).

The loop is the replay learners' (``OffPolicyAlgorithm``), fed by ``input``'s datasets instead of
the envs: each phase reads recorded steps into the buffer, then each minibatch step of a trained
policy is

    loss = -mean_b log pi(a_b | s_b)

over the recorded actions ``a_b`` (under the recorded action mask, for Discrete actions): the
cross-entropy for Discrete and MultiDiscrete actions, the Gaussian negative log-likelihood (mean
and the learned standard deviation) for Box actions. Evaluation acts with the most likely action.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.algos.optim import AutogradOptimizer
from shoal.config.offline_learners import BCConfig
from shoal.models.policy import ActorCriticPolicy


class BCAlgorithm(OffPolicyAlgorithm[BCConfig, ActorCriticPolicy, "BCLearner"]):
    name = "BC"
    config_class = BCConfig
    STAT_NAMES = ("loss", "log_prob", "entropy")

    def make_learner(self, policy_id: str, config: BCConfig) -> BCLearner:
        return BCLearner(self.policies[policy_id], config)

    def minibatch(self, index: torch.Tensor, policy_id: str) -> TensorDict:
        """The sampled steps as stored: behaviour cloning reads no returns and no next observation."""
        return self.replay.gather(index, 1)[0]


class BCLearner:
    """One policy's minibatch step: the negative log-likelihood of the recorded actions."""

    def __init__(self, policy: ActorCriticPolicy, config: BCConfig):
        self.policy = policy
        self.optimizer = AutogradOptimizer(
            policy, config.learning_rate, config.adam_eps, config.max_grad_norm, policy.policy_id
        )
        self.optimizers = [self.optimizer]

    def prepare(self, batch: TensorDict) -> TensorDict:
        return batch

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        params, _ = self.policy(batch["obs"])
        log_prob, entropy = self.policy.score(params, batch["action"], True, batch.get("action_mask", None))
        assert entropy is not None  # asked for
        loss = -(log_prob if weights is None else log_prob * weights).mean()
        self.optimizer.backward(loss)
        self.optimizer.step()
        stats = {"loss": loss.detach(), "log_prob": log_prob.detach().mean(), "entropy": entropy.detach().mean()}
        return stats, torch.zeros_like(log_prob.detach())

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
