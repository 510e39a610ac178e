"""MARWIL: monotonic advantage re-weighted imitation learning (Wang et al. 2018, "Exponentially
Weighted Imitation Learning for Batched Historical Data"), as RLlib has it.

The loop is the replay learners' (``OffPolicyAlgorithm``), fed by ``input``'s datasets: the reader
gives every recorded step its discounted return to the end of its episode, ``return_to_go``
(``gamma``; a truncated episode's is not bootstrapped). Each minibatch step of a trained policy:

    A      = return_to_go - V(s)
    c^2   <- c^2 + moving_average_sqd_adv_norm_update_rate * (mean(A^2) - c^2)
    loss   = -mean[ exp(beta * A / c) * log pi(a | s) ] + vf_coeff * mean[ 0.5 * A^2 ]

with the weights ``exp(beta * A / c)`` held constant (no gradient). ``beta = 0`` is behaviour
cloning with a value function learned beside it; the larger ``beta``, the more the policy imitates
the steps that did better than their state's value.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from shoal.algos.base import SCALAR
from shoal.algos.off_policy import OffPolicyAlgorithm
from shoal.algos.optim import AutogradOptimizer
from shoal.buffers.rollout import FieldSpec
from shoal.config import MARWILConfig
from shoal.models.policy import ActorCriticPolicy


class MARWILAlgorithm(OffPolicyAlgorithm[MARWILConfig, ActorCriticPolicy, "MARWILLearner"]):
    name = "MARWIL"
    config_class = MARWILConfig
    STAT_NAMES = ("policy_loss", "vf_loss", "mean_advantage", "advantage_norm", "weight_mean")

    def extra_fields(self) -> dict[str, FieldSpec]:
        """Each recorded step's discounted return to its episode's end, which the dataset reader fills."""
        return super().extra_fields() | {"return_to_go": SCALAR}

    def make_learner(self, policy_id: str, config: MARWILConfig) -> MARWILLearner:
        return MARWILLearner(self.policies[policy_id], config)

    def minibatch(self, index: torch.Tensor, policy_id: str) -> TensorDict:
        """The sampled steps as stored, their return to go with them."""
        return self.replay.gather(index, 1)[0]


class MARWILLearner:
    """One policy's advantage-weighted imitation and value function, and the running norm ``c^2``."""

    def __init__(self, policy: ActorCriticPolicy, config: MARWILConfig):
        self.policy, self.config = policy, config
        self.optimizer = AutogradOptimizer(
            policy, config.learning_rate, config.adam_eps, config.max_grad_norm, policy.policy_id
        )
        self.optimizers = [self.optimizer]
        device = next(policy.parameters()).device
        self.squared_norm = torch.tensor(config.moving_average_sqd_adv_norm_start, device=device)

    def prepare(self, batch: TensorDict) -> TensorDict:
        return batch

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        c = self.config
        log_prob, _, value = self.policy.evaluate(batch["obs"], batch["action"], False, batch.get("action_mask", None))
        advantage = batch["return_to_go"] - value
        with torch.no_grad():
            self.squared_norm += c.moving_average_sqd_adv_norm_update_rate * (
                advantage.square().mean() - self.squared_norm
            )
            weight = torch.exp(c.beta * advantage / (self.squared_norm.sqrt() + 1e-8))
        policy_loss = -(weight * log_prob).mean()
        vf_loss = 0.5 * advantage.square().mean()
        self.optimizer.backward(policy_loss + c.vf_coeff * vf_loss)
        self.optimizer.step()
        stats = {
            "policy_loss": policy_loss.detach(),
            "vf_loss": vf_loss.detach(),
            "mean_advantage": advantage.detach().mean(),
            "advantage_norm": self.squared_norm.sqrt(),
            "weight_mean": weight.mean(),
        }
        return stats, advantage.detach().abs()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "squared_norm": self.squared_norm.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.squared_norm.copy_(state["squared_norm"])
