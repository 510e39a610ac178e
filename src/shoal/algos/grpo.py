"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300), critic-free.

A group is ``group_size`` episodes started from the same reset seed. Each iteration:

1. **Resets** every env with group seeds: envs ``g*G .. g*G+G-1`` all get group ``g``'s seed, drawn
   afresh each iteration from ``(seed, iteration)`` (so a resumed run draws the same ones).
2. **Collects** until every env's first episode has ended (``collect(until_done=True)``: a group
   of envs stops stepping once each of its envs has ended one; ``rollout_fragment_length`` caps it).
   Steps after a row's first episode, and the padding of groups that stopped early, learn nothing.
3. **Advantages**: every step of a row's first episode gets ``(R - mean_group(R)) /
   (std_group(R) + adv_eps)``, where ``R`` is that episode's undiscounted return
   (``returns.group_relative``).
4. **Epochs** of shuffled minibatches of those steps (the loop is ``OnPolicyAlgorithm``'s): PPO's
   clipped surrogate on these advantages
   (no value function, no per-minibatch advantage normalization), minus ``ent_coef`` x entropy,
   plus ``kl_coef`` x ``KL(pi || pi_ref)`` (k3 estimator) to a frozen reference policy: a copy of
   the policy taken when training starts and refreshed every ``ref_update_interval`` iterations
   (none is kept when ``kl_coef`` is 0).

The policy is the default actor-critic (``model`` / ``model_config``): its value head is never
asked for a value by the loss and gets no gradient, so it costs one small forward per minibatch
and keeps GRPO's checkpoints, evaluation and custom models the same as PPO's. Single-agent envs
with one policy only: groups of multi-agent envs would compare each agent slot within its group,
which is not built yet.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from shoal.algos.base import SCALAR, Collector, Statistics
from shoal.algos.losses import clipped_surrogate, kl_k3, policy_stats
from shoal.algos.on_policy import Minibatch, OnPolicyAlgorithm, PolicyLearner
from shoal.algos.returns import group_relative
from shoal.buffers.rollout import FieldSpec
from shoal.config import GRPOConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.policy import ActorCriticPolicy
from shoal.models.recurrent import RecurrentActorCriticPolicy

GRPOLearner = PolicyLearner[GRPOConfig, ActorCriticPolicy]


class GRPOAlgorithm(OnPolicyAlgorithm[GRPOConfig, ActorCriticPolicy]):
    name = "GRPO"
    config_class = GRPOConfig
    extras = ("sample_log_prob",)  # stored per step: the behaviour policy's log-prob (no value: no critic)
    STAT_NAMES = ("policy_loss", "entropy", "approx_kl", "clipfrac", "kl")
    LEARN_KEYS = ("obs", "action", "sample_log_prob", "advantage")

    def __init__(self, config: GRPOConfig, env: EnvInfo):
        if env.rows_per_env > 1:
            raise ConfigError(
                f"GRPO trains single-agent envs; env '{env.name}' has {env.rows_per_env} agent rows per env "
                f"(groups of multi-agent episodes are not built yet). Use algo=ppo for multi-agent envs."
            )
        if len(config.policy_ids) > 1:
            raise ConfigError(
                f"GRPO trains one policy; got policies {config.policy_ids}. Leave policies unset (or name one policy)."
            )
        super().__init__(config, env)
        self.policy = self.policies[config.policy_ids[0]]
        if isinstance(self.policy, RecurrentActorCriticPolicy):
            raise ConfigError(
                "GRPO learns from single steps, so it takes feedforward models only; drop model_config "
                "'core' (recurrent policies train with algo=ppo)."
            )
        self.num_groups = env.num_envs // config.group_size
        self.iterations = 0
        """Training steps taken: which group seeds the next one draws, and when the reference is refreshed."""
        self.reference = copy.deepcopy(self.policy).requires_grad_(False) if config.kl_coef > 0 else None
        """The frozen reference policy of the KL penalty (None when ``kl_coef`` is 0)."""

    def rollout_fields(self) -> dict[str, FieldSpec]:
        fields = super().rollout_fields()
        if self.config.kl_coef > 0:  # the reference policy's log-probabilities of the steps learnt from
            fields["ref_log_prob"] = SCALAR
        return fields

    def learn_keys(self, rollout: TensorDict) -> tuple[str, ...]:
        reference = ("ref_log_prob",) if self.reference is not None else ()
        return (*super().learn_keys(rollout), *reference)

    def group_seeds(self, iteration: int) -> list[int]:
        """The reset seed of every env at iteration ``iteration``: one per group, drawn from
        ``(seed, iteration)``, repeated for the ``group_size`` envs of the group."""
        drawn = np.random.default_rng([self.config.seed, iteration]).integers(0, 2**31 - 1, size=self.num_groups)
        return [int(seed) for seed in np.repeat(drawn, self.config.group_size)]

    def data_parallel_problem(self) -> str | None:
        return "GRPO: its minibatches follow each rank's episodes, so ranks would take different numbers of steps"

    def describe(self) -> str:
        c = self.config
        return (
            f"groups: {self.num_groups} x group_size={c.group_size} envs, each env's first episode "
            f"(up to rollout_fragment_length={c.rollout_fragment_length} steps)"
        )

    def training_step(self, collector: Collector) -> dict[str, Any]:
        c = self.config
        interval = c.ref_update_interval
        if self.reference is not None and interval and self.iterations and self.iterations % interval == 0:
            self.reference.load_state_dict(self.policy.state_dict())
        collector.reset(self.group_seeds(self.iterations))
        rollout = self.collect_rollout(collector, until_done=True)
        # The advantages are the whole rollout's, computed here, where the group statistics need them too.
        steps = rollout[:, :-1]
        with torch.no_grad():
            advantage, first, returns = group_relative(
                steps["reward"], steps["done"], steps["valid"], group_size=c.group_size, eps=c.adv_eps
            )
            rollout["advantage"][:, :-1] = advantage
            if self.reference is not None:
                mask = steps["action_mask"][first] if "action_mask" in steps.keys() else None  # noqa: SIM118 (a TensorDict)
                reference = self.reference.evaluate(steps["obs"][first], steps["action"][first], False, mask)[0]
                rollout["ref_log_prob"][:, :-1][first] = reference
        stats = self.group_stats(returns, first, steps["done"]) | self.learn_policies(rollout, select=first)
        self.iterations += 1
        return stats

    def advantages(self, learner: GRPOLearner, rollout: TensorDict) -> None:
        """Nothing to do: ``training_step`` has written the group-relative advantages into the
        rollout already, since the group statistics it reports need them whether or not the policy
        is trained."""

    def group_stats(self, returns: torch.Tensor, first: torch.Tensor, done: torch.Tensor) -> dict[str, float]:
        """What the iteration's groups looked like: their mean return, the mean of their return
        stds, the fraction whose episodes all returned the same (no learning signal), and the
        first episodes the fragment cut before they ended."""
        grouped = returns.view(self.num_groups, -1)
        std = grouped.std(1)
        ended = (first & done).any(1)
        return {
            "group_return_mean": grouped.mean().item(),
            "group_return_std": std.mean().item(),
            "groups_without_signal": (std == 0).float().mean().item(),
            "episodes_unfinished": int((~ended).sum()),
            "learn_steps": int(first.sum()),
        }

    def step(self, learner: GRPOLearner, minibatch: Minibatch, stats: Statistics | None) -> None:
        """The clipped surrogate on the group-relative advantages, minus the entropy bonus, plus
        the KL penalty to the reference policy; backward and an optimizer step."""
        c, batch = learner.config, minibatch.data
        log_prob, entropy, _ = learner.policy.evaluate(
            batch["obs"], batch["action"], stats is not None or c.ent_coef > 0, batch.get("action_mask", None)
        )
        policy_loss, ratio = clipped_surrogate(
            log_prob, batch["sample_log_prob"], batch["advantage"], None, c.clip_coef
        )
        loss = policy_loss
        if c.ent_coef:
            assert entropy is not None  # asked for with ent_coef
            loss = loss - c.ent_coef * entropy.mean()
        kl = torch.zeros((), device=log_prob.device)
        if self.reference is not None:
            kl = kl_k3(log_prob, batch["ref_log_prob"], None)
            loss = loss + c.kl_coef * kl
        learner.optimizer.backward(loss)
        learner.optimizer.step()
        if stats is not None and entropy is not None:
            with torch.no_grad():
                approx_kl, clipfrac = policy_stats(ratio, c.clip_coef, None)
                stats.add(
                    {
                        "policy_loss": policy_loss,
                        "entropy": entropy.mean(),
                        "approx_kl": approx_kl,
                        "clipfrac": clipfrac,
                        "kl": kl,
                    }
                )

    def learn(self, learner: GRPOLearner, rollout: TensorDict, select: torch.Tensor | None) -> dict[str, float]:
        result = super().learn(learner, rollout, select)
        if self.reference is None:
            del result["kl"]
        return result

    def state_dict(self) -> dict[str, Any]:
        reference = None if self.reference is None else self.reference.state_dict()
        return {**super().state_dict(), "iterations": self.iterations, "reference": reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "learners" not in state:  # written before GRPO learnt on the on-policy base
            state = {
                **state,
                "learners": {self.config.policy_ids[0]: {k: state[k] for k in ("optimizer", "generator")}},
            }
        super().load_state_dict(state)
        self.iterations = state["iterations"]
        if self.reference is not None:
            self.reference.load_state_dict(state["reference"])
