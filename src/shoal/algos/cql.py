"""Conservative Q-learning (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement
Learning"): a Q-learner on recorded steps whose values of actions the data did not take are pushed
down, so that the policy does not chase the errors of a Q-function where no data corrects it.

The loop is the replay learners' (``OffPolicyAlgorithm``), fed by ``input``'s datasets. Each step
adds ``min_q_weight`` times the conservative term to the critic's loss, CQL(H):

    Discrete (on DQN):  mean_b [ logsumexp_a Q(s_b, a) - Q(s_b, a_b) ]     (over the legal actions)
    Box (on SAC):       mean_b [ T * logsumexp_j (Q(s_b, a_j) - log rho(a_j)) / T - Q(s_b, a_b) ], per critic,
                        the a_j ``num_actions`` draws each from uniform(-1, 1) (rho = 2^-d), pi(s_b) and pi(s'_b)
                        (rho = their probability), an importance-sampled log-sum-exp over all actions

with ``a_b`` the recorded action. The rest is DQN's step (Discrete: the Huber TD loss, double Q,
target updates) or SAC's (Box: twin critics, the actor and the learned entropy coefficient).
``CQLAlgorithm`` builds the one that fits the env's actions.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict

from shoal.algos.base import Algorithm
from shoal.algos.dqn import DQNAlgorithm, DQNLearner
from shoal.algos.sac import SACAlgorithm, SACLearner
from shoal.config import CQLConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.actors import QTowers, SquashedGaussianPolicy
from shoal.models.qpolicy import QPolicy

MIN_Q_WEIGHT = {"discrete": 1.0, "continuous": 5.0}
"""``min_q_weight=None``: the paper's weights (its Atari runs and its continuous-control ones)."""


def conservative_weight(config: CQLConfig, kind: str) -> float:
    return MIN_Q_WEIGHT[kind] if config.min_q_weight is None else config.min_q_weight


class CQLAlgorithm(Algorithm[CQLConfig]):
    """``algo=cql``: the DQN-based learner for Discrete actions, the SAC-based one for Box actions."""

    name = "CQL"
    config_class = CQLConfig

    @classmethod
    def implementation(cls, config: TrainerConfig, env: EnvInfo | None = None) -> type[Algorithm[Any, Any]]:
        if env is None:
            return cls
        kind = env.act_spec.kind
        if kind == "discrete":
            return DiscreteCQL
        if kind == "continuous":
            return ContinuousCQL
        raise ConfigError(f"CQL learns Discrete or Box actions; env '{env.name}' has {env.act_spec.space}.")


class DiscreteCQL(DQNAlgorithm):
    name = "CQL"
    config_class = CQLConfig

    def make_learner(self, policy_id: str, config: Any) -> DQNLearner:
        return DiscreteCQLLearner(self.policies[policy_id], config)


class DiscreteCQLLearner(DQNLearner):
    """DQN's step with the conservative term over the legal actions."""

    def __init__(self, policy: QPolicy, config: CQLConfig):
        super().__init__(policy, config)
        self.weight = conservative_weight(config, "discrete")

    def penalty(self, q_all: torch.Tensor, q: torch.Tensor, batch: TensorDict) -> torch.Tensor | None:
        mask = batch.get("action_mask", None)
        legal = q_all if mask is None else q_all.masked_fill(~mask, -math.inf)
        return self.weight * (torch.logsumexp(legal, dim=1) - q).mean()


class ContinuousCQL(SACAlgorithm):
    name = "CQL"
    config_class = CQLConfig

    def make_learner(self, policy_id: str, config: Any) -> SACLearner:
        return ContinuousCQLLearner(self.policies[policy_id], self.critic(policy_id), config)


class ContinuousCQLLearner(SACLearner):
    """SAC's step with the conservative term on the critics."""

    config: CQLConfig

    def __init__(self, policy: SquashedGaussianPolicy, critic: QTowers, config: CQLConfig):
        super().__init__(policy, critic, config)
        self.weight = conservative_weight(config, "continuous")

    def critic_penalty(self, x: torch.Tensor, next_x: torch.Tensor, data_action: torch.Tensor) -> torch.Tensor | None:
        n, temp, critic = self.config.num_actions, self.config.temperature, self.critic
        rows, dims = data_action.shape
        states = x.repeat(n, 1)  # draw j of state b at row j * rows + b
        with torch.no_grad():
            uniform = torch.rand(n * rows, dims, device=x.device) * 2 - 1
            at_state, logp_state = self.policy.sample(states)
            at_next, logp_next = self.policy.sample(next_x.repeat(n, 1))
        uniform_logp = torch.full_like(logp_state, -dims * math.log(2.0))
        scores = [
            critic.values(states, action) - logp  # [critics, n * rows]
            for action, logp in ((uniform, uniform_logp), (at_state, logp_state), (at_next, logp_next))
        ]
        draws = torch.cat([s.view(-1, n, rows) for s in scores], dim=1)  # [critics, 3n, rows]
        soft_max = temp * torch.logsumexp(draws / temp, dim=1)
        data = critic.values(x, data_action)
        return self.weight * (soft_max - data).mean(1).sum()
