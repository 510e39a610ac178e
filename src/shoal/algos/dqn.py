"""DQN (Mnih et al. 2015) with the usual improvements: double Q-learning (van Hasselt et al. 2016),
dueling heads (Wang et al. 2016), n-step returns and prioritized replay (Schaul et al. 2016).

Each trained policy's learner minimizes the Huber loss between ``Q(s, a)`` and the target

    y = R_n + discount * Q_target(s_n, argmax_a' Q(s_n, a'))    (double_q=False: max_a' Q_target(s_n, a'))

over minibatches from the replay buffer, where ``R_n`` is the n-step discounted reward sum and
``discount`` is ``gamma ** n`` (0 after a terminal step; see ``off_policy.transitions``). The next
action is chosen among the legal actions when the env masks them. With ``advantage_learning``
``alpha > 0`` the target is advantage learning's (Bellemare et al. 2016, "Increasing the Action
Gap"): ``y - alpha * (max_b Q_target(s, b) - Q_target(s, a))``, which lowers the value of every
action but the greedy one, so that the greedy choice in a state is not flipped by errors smaller
than the gap (the max over the legal actions). The target network is a copy
of the Q-network, moved toward it by ``tau`` every ``target_update_interval`` env steps; the
policy acts epsilon-greedily with epsilon annealed linearly over ``exploration_fraction`` of each
``learn()`` call.

With a recurrent core (``model_config`` ``core``) it is R2D2's recurrent DQN (Kapturowski et al.
2019): the replay holds sequences with the state stored at their start (``SequenceReplayBuffer``);
each sequence is replayed from it, its first ``replay_burn_in`` steps without gradient only to
bring the state up to date, and the loss is the mean over the steps after them. The target network
is unrolled the same way, and each next observation is valued from the state after the last step
summed before it. Prioritized replay gives each sequence ``eta * max + (1 - eta) * mean`` of its
steps' absolute TD errors.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from shoal.algos.base import Collector
from shoal.algos.off_policy import OffPolicyAlgorithm, bootstrapped
from shoal.algos.optim import AutogradOptimizer, TargetNetwork
from shoal.buffers import PrioritizedSequenceReplayBuffer, ReplayBuffer, SequenceReplayBuffer
from shoal.config import DQNConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import build_q_policy
from shoal.models.qpolicy import QPolicy, RecurrentQPolicy, greedy
from shoal.models.recurrent import RecurrentModel


class DQNAlgorithm(OffPolicyAlgorithm[DQNConfig, QPolicy, "DQNLearner"]):
    name = "DQN"
    config_class = DQNConfig
    STAT_NAMES = ("loss", "q_mean", "td_error")

    def __init__(self, config: DQNConfig, env: EnvInfo):
        super().__init__(config, env)
        self.epsilon = config.exploration_initial_eps

    def make_replay(self) -> ReplayBuffer:
        """Steps for feedforward Q-networks; for recurrent ones, sequences with their start states."""
        recurrent = [pid for pid, policy in self.policies.items() if isinstance(policy, RecurrentQPolicy)]
        if not recurrent:
            return super().make_replay()
        c = self.config
        feedforward = [pid for pid in self.policies if pid not in recurrent]
        if feedforward:
            raise ConfigError(
                f"recurrent DQN replays sequences for every policy, but {feedforward} have no recurrent core while "
                f"{recurrent} do; give every policy model_config core='lstm' or 'gru', or none of them."
            )
        sequences: dict[str, Any] = {
            "initial_states": [policy.initial_state(1) for policy in self.policies.values()],
            "sequence_length": c.replay_sequence_length,
            "burn_in": c.replay_burn_in,
        }
        fields, size = self.extra_fields(), c.buffer_size
        try:
            if c.prioritized_replay:
                alpha, policies = c.prioritized_replay_alpha, len(c.policy_ids)
                return PrioritizedSequenceReplayBuffer(self.env, size, fields, c.device, alpha, policies, **sequences)
            return SequenceReplayBuffer(self.env, size, fields, c.device, **sequences)
        except ValueError as e:
            raise ConfigError(f"recurrent DQN cannot replay these sequences: {e}.") from None

    def make_policy(self, policy_id: str, config: DQNConfig) -> QPolicy:
        """An epsilon-greedy Q-network policy: ``model`` with one output per action."""
        return build_q_policy(config, self.env, config.dueling)

    def make_learner(self, policy_id: str, config: DQNConfig) -> DQNLearner:
        policy = self.policies[policy_id]
        if isinstance(policy, RecurrentQPolicy):
            return SequenceDQNLearner(policy, config)
        return DQNLearner(policy, config)

    def before_phase(self, progress: float) -> None:
        self.epsilon = self.config.epsilon(progress)
        for pid in self.trained_policy_ids:  # a frozen policy acts as it has learned
            self.policies[pid].epsilon = self.epsilon
        super().before_phase(progress)

    def after_phase(self, steps_before: int) -> None:
        """Target updates due in the phase: ``k`` of them move the target as one update with
        ``1 - (1 - tau) ** k``."""
        interval = self.config.target_update_interval
        due = self.timesteps // interval - steps_before // interval
        if due:
            tau = 1.0 - (1.0 - self.config.tau) ** due
            for learner in self.learners.values():
                learner.target.update(tau)

    def rollout_states(self) -> list[TensorDict] | None:
        """The sequence replay's tables of start states, which the collector fills."""
        if isinstance(self.replay, SequenceReplayBuffer):
            return self.replay.rollout_states(self.rollout.horizon)
        return None

    def training_step(self, collector: Collector) -> dict[str, Any]:
        return super().training_step(collector) | {"epsilon": self.epsilon}

    def describe(self) -> str:
        c = self.config
        sequences = ""
        if isinstance(self.replay, SequenceReplayBuffer):
            sequences = (
                f" in sequences of {c.replay_sequence_length} ({c.replay_burn_in} burn-in), "
                f"{self.replay.sequences_for(c.sgd_minibatch_size)} per minibatch"
            )
        return (
            f"replay: {c.buffer_size} steps{sequences}; phases of {c.train_batch_size} env steps, each then "
            f"{c.gradient_steps} minibatches of {c.sgd_minibatch_size} (after {c.learning_starts} steps)"
        )


class DQNLearner:
    """One Q-network's target copy, optimizer and minibatch step."""

    def __init__(self, policy: QPolicy, config: DQNConfig):
        self.policy, self.config = policy, config
        self.target = TargetNetwork(policy.model)
        self.optimizer = AutogradOptimizer(
            policy, config.learning_rate, config.adam_eps, config.max_grad_norm, policy.policy_id
        )
        self.optimizers = [self.optimizer]

    @torch.no_grad()
    def prepare(self, batch: TensorDict) -> TensorDict:
        """The target network's values of the next observations, for all of ``batch`` in one
        forward (it holds through a phase: ``after_phase`` moves it): ``next_q_target``, and the
        targets themselves (``target``) when the next action is the target network's own choice,
        written into ``batch``; returned are only the fields ``learn`` reads (fewer to split into
        minibatches)."""
        next_q = self.policy.q_values(batch["next_obs"], self.target.module)
        alpha = self.config.advantage_learning
        if alpha:  # the target's own action gap at s, subtracted from the reward sum
            q = self.policy.q_values(batch["obs"], self.target.module)
            batch["reward"] = batch["reward"] - alpha * action_gap(q, batch["action"], batch.get("action_mask", None))
        masks = [key for key in ("action_mask", "next_action_mask") if key in batch.keys()]  # noqa: SIM118
        if not self.config.double_q:
            batch["target"] = q_target(batch, next_q, next_q)
            return batch.select("obs", "action", "target", *masks[:1])
        batch["next_q_target"] = next_q
        return batch.select("obs", "action", "next_obs", "reward", "discount", "next_q_target", *masks)

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One minibatch step on ``batch`` as ``prepare`` left it (its target values in)."""
        policy = self.policy
        if self.config.double_q:  # the next action is the online network's choice
            with torch.no_grad():
                target = q_target(batch, batch["next_q_target"], policy.q_values(batch["next_obs"]))
        else:
            target = batch["target"]
        q_all = policy.q_values(batch["obs"])
        q = taken(q_all, batch["action"])
        if weights is None:
            loss = F.smooth_l1_loss(q, target)
        else:
            loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        penalty = self.penalty(q_all, q, batch)
        self.optimizer.backward(loss if penalty is None else loss + penalty)
        self.optimizer.step()
        td_error = (q.detach() - target).abs()
        return {"loss": loss.detach(), "q_mean": q.detach().mean(), "td_error": td_error.mean()}, td_error

    def penalty(self, q_all: torch.Tensor, q: torch.Tensor, batch: TensorDict) -> torch.Tensor | None:
        """A term added to the loss from the values of every action ``q_all`` and of the taken one
        ``q`` (conservative Q-learning's); None: none."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "target": self.target.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.target.load_state_dict(state["target"])


class SequenceDQNLearner(DQNLearner):
    """A recurrent Q-network's minibatch step on sequences (``SequenceReplayBuffer.gather`` through
    ``transitions``): online and target networks unrolled from each stored start state, the
    burn-in without gradient, the Huber loss averaged over the learned steps (``mask``), one
    priority per sequence."""

    policy: RecurrentQPolicy

    def prepare(self, batch: TensorDict) -> TensorDict:
        """``batch`` as it is: the target network is unrolled with the online one in ``learn``."""
        return batch

    def learn(self, batch: TensorDict, weights: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        policy, burn_in = self.policy, self.config.replay_burn_in
        obs, first, start = batch["obs"], batch["first"], batch["start_state"]
        steps = batch.exclude("start_state")
        steps.batch_size = first.shape  # [B, L]
        learned: TensorDict = steps[:, burn_in:]  # past the burn-in
        states = policy.unroll(obs, start, first, burn_in)
        with torch.no_grad():
            at = learned["last_step"] - burn_in  # the next observation is seen with the state after that step
            target_model = cast(RecurrentModel, self.target.module)
            target_states = policy.unroll(obs, start, first, burn_in, target_model)
            next_obs = learned["next_obs"].flatten(0, 1)
            next_q = policy.q_values(next_obs, target_model, self.states_at(target_states, at)).view(*at.shape, -1)
            chooser = next_q
            if self.config.double_q:
                chooser = policy.q_values(next_obs, None, self.states_at(states, at)).view(*at.shape, -1)
            target = q_target(learned, next_q, chooser)
            if self.config.advantage_learning:  # the target core's own action gap at each learned step
                here = policy.q_of(target_states, target_model)
                gap = action_gap(here, learned["action"], learned.get("action_mask", None))
                target = target - self.config.advantage_learning * gap
        q = taken(policy.q_of(states), learned["action"])
        mask = learned["mask"]
        count = mask.sum().clamp(min=1)
        loss = torch.where(mask, F.smooth_l1_loss(q, target, reduction="none"), 0.0)
        loss = (loss if weights is None else weights.unsqueeze(1) * loss).sum() / count
        self.optimizer.backward(loss)
        self.optimizer.step()
        td_error = torch.where(mask, (q.detach() - target).abs(), 0.0)
        eta = self.config.replay_priority_eta
        priority = eta * td_error.amax(1) + (1 - eta) * td_error.sum(1) / mask.sum(1).clamp(min=1)
        q_mean = torch.where(mask, q.detach(), 0.0).sum() / count
        return {"loss": loss.detach(), "q_mean": q_mean, "td_error": td_error.sum() / count}, priority

    def states_at(self, states: tuple[torch.Tensor, ...], at: torch.Tensor) -> TensorDict:
        """The states ``[B, S, width]`` (one per state key) at positions ``at [B, S]``, flat ``[B * S]``."""
        index = at.unsqueeze(-1).expand(*at.shape, states[0].shape[-1])
        picked = {key: state.gather(1, index).flatten(0, 1) for key, state in zip(self.policy.model.state_keys, states)}
        return TensorDict(picked, batch_size=[at.numel()])


def q_target(batch: TensorDict, next_q: torch.Tensor, chooser: torch.Tensor) -> torch.Tensor:
    """``R_n + discount * next_q[argmax chooser]``, the argmax over the legal next actions
    (``next_action_mask`` when the env masks them)."""
    return bootstrapped(batch, taken(next_q, greedy(chooser, batch.get("next_action_mask", None))))


def action_gap(q: torch.Tensor, action: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
    """How far ``action`` falls below the best legal action in Q-values ``q`` ``[..., n]``
    (advantage learning's gap, >= 0)."""
    return taken(q, greedy(q, action_mask)) - taken(q, action)


def taken(q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The value of ``action`` in Q-values ``[..., n]``."""
    return q.gather(-1, action.unsqueeze(-1)).squeeze(-1)
