"""PQN: parallel Q-learning (Gallici et al., "Simplifying Deep Temporal Difference Learning", ICLR 2025).

Q-learning at on-policy speed: many envs act epsilon-greedily on one Q-network, and each
iteration's rollout is learned from the way PPO learns from its own, then dropped. There is no
replay buffer and no target network: LayerNorm in the Q-network (on by default for the built-in
models, ``model_config`` ``layer_norm``) is what keeps the bootstrapped targets from running
away, and the many envs decorrelate the data a replay buffer would.

One training step (the loop is ``OnPolicyAlgorithm``'s):

1. every trained policy gets this iteration's epsilon (``exploration_*``, linear over each
   ``learn()``); a frozen one (not in ``policies_to_train``) acts greedily;
2. collect ``[N, T+1]``: each step stores ``value``, the greedy value ``max_a Q(s_t, a)`` over the
   legal actions as the policy acted (the last slot's bootstraps the tail; a truncated episode's
   last observation is valued over every action when the env resets in the same step, which
   keeps no action mask for it, and as a stored slot when it resets in the next);
3. each trained policy, on the steps it took: Q(lambda) returns over the whole rollout
   (``returns.q_lambda_returns`` with its ``gamma`` and ``q_lambda``, rewards times
   ``reward_scale``), then ``num_sgd_iter`` epochs of shuffled minibatches of single transitions,
   each one ``step``: ``0.5 * (Q(s, a) - G)^2``, backward, a clipped RAdam (or Adam) step.

Discrete actions only; action masks, several agents and several policies come through the same
flat batch as PPO's. Feedforward Q-networks only: a recurrent core would need the segment
learner's replay of stored states.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

from shoal.algos.base import Collector, Statistics
from shoal.algos.dqn import taken
from shoal.algos.losses import masked_mean
from shoal.algos.on_policy import Minibatch, OnPolicyAlgorithm, PolicyLearner, decisions
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.returns import q_lambda_returns
from shoal.buffers.rollout import FieldSpec
from shoal.config import PQNConfig
from shoal.errors import ConfigError
from shoal.models.catalog import build_q_policy
from shoal.models.qpolicy import QPolicy, RecurrentQPolicy

Learner = PolicyLearner[PQNConfig, QPolicy]


class PQNAlgorithm(OnPolicyAlgorithm[PQNConfig, QPolicy]):
    name = "PQN"
    config_class = PQNConfig
    extras = ("value",)  # stored per step: the greedy value the returns bootstrap from
    STAT_NAMES = ("loss", "q_mean")
    LEARN_KEYS = ("obs", "action", "value", "return")

    def make_policy(self, policy_id: str, config: PQNConfig) -> QPolicy:
        """An epsilon-greedy Q-network: ``model`` with one output per action, LayerNorm on by default."""
        policy = build_q_policy(config, self.env, dueling=False, defaults={"layer_norm": True})
        if isinstance(policy, RecurrentQPolicy):
            raise ConfigError(
                f"PQN learns from single transitions, so it takes feedforward Q-networks only; drop model_config "
                f"'core' for policy '{policy_id}' (recurrent Q-learning trains with algo=dqn)."
            )
        return policy

    def make_optimizer(self, policy: QPolicy, config: PQNConfig) -> AutogradOptimizer:
        return AutogradOptimizer(
            policy,
            config.learning_rate,
            config.adam_eps,
            config.max_grad_norm,
            owner=policy.policy_id,
            rectified=config.optimizer == "radam",
        )

    def rollout_fields(self) -> dict[str, FieldSpec]:
        """The greedy values and what the returns need; no advantage is learned from."""
        fields = super().rollout_fields()
        del fields["advantage"]
        return fields

    def training_step(self, collector: Collector) -> dict[str, Any]:
        epsilon = self.config.epsilon(self.progress)
        for pid in self.trained_policy_ids:  # a frozen policy acts as it has learned
            self.policies[pid].epsilon = epsilon
        return super().training_step(collector) | {"epsilon": epsilon}

    def advantages(self, learner: Learner, rollout: TensorDict) -> None:
        """Q(lambda) returns into ``return``."""
        c, steps = learner.config, rollout[:, :-1]
        rollout["return"][:, :-1] = q_lambda_returns(
            steps["reward"] * c.reward_scale,
            rollout["value"],
            steps["terminated"],
            steps["truncated"],
            steps["final_value"],
            gamma=c.gamma,
            q_lambda=c.q_lambda,
            valid_t=decisions(steps["valid"]),
        )

    def step(self, learner: Learner, minibatch: Minibatch, stats: Statistics | None) -> None:
        """Half the squared error of ``Q(s, a)`` against the return, backward, one optimizer step."""
        batch, mask = minibatch.data, minibatch.mask
        q = taken(learner.policy.q_values(batch["obs"]), batch["action"])
        loss = 0.5 * masked_mean((q - batch["return"]).square(), mask)
        learner.optimizer.backward(loss)
        learner.optimizer.step()
        if stats is not None:
            stats.add({"loss": loss.detach(), "q_mean": masked_mean(q.detach(), mask)})

    def describe(self) -> str:
        c = self.config
        return (
            f"{c.num_envs} envs x {c.rollout_fragment_length} steps, then {c.num_sgd_iter} epochs of minibatches "
            f"of about {c.sgd_minibatch_size}; epsilon {c.exploration_initial_eps:g} -> {c.exploration_final_eps:g} "
            f"over the first {c.exploration_fraction:.0%}"
        )
