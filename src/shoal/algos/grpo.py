"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300), critic-free.

A group is ``group_size`` episodes started from the same reset seed. Each iteration:

1. **Resets** every env with group seeds: envs ``g*G .. g*G+G-1`` all get group ``g``'s seed, drawn
   afresh each iteration from ``(seed, iteration)`` (so a resumed run draws the same ones).
2. **Collects** until every env's first episode has ended (``collect(until_done=True)``: a group
   of envs stops stepping once each of its envs has ended one; ``rollout_fragment_length`` caps it).
   Steps after a row's first episode, and the padding of groups that stopped early, learn nothing.
3. **Advantages**: every step of a row's first episode gets ``(R - mean_group(R)) /
   (std_group(R) + adv_eps)``, where ``R`` is that episode's undiscounted return
   (``advantages.group_relative``).
4. **Epochs** of shuffled minibatches of those steps: PPO's clipped surrogate on these advantages
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
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDict

from shoal.algos.advantages import group_relative
from shoal.algos.base import SCALAR, Algorithm, Collector
from shoal.algos.losses import clipped_surrogate, kl_k3, past_target_kl, policy_stats
from shoal.algos.optim import AutogradOptimizer
from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.config import GRPOConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import build_policy
from shoal.models.policy import ActorCriticPolicy
from shoal.models.recurrent import RecurrentActorCriticPolicy

STAT_NAMES = ("policy_loss", "entropy", "approx_kl", "clipfrac", "kl")
LEARN_KEYS = ("obs", "action", "sample_log_prob", "advantage")


class GRPOAlgorithm(Algorithm):
    name = "GRPO"
    config_class = GRPOConfig
    extras = ("sample_log_prob",)  # stored per step: the behaviour policy's log-prob (no value: no critic)

    config: GRPOConfig  # built from config_class by the trainer

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
        self.policy_id = config.policy_ids[0]
        self.policy = cast(ActorCriticPolicy, self.policies[self.policy_id])  # built by make_policy
        if isinstance(self.policy, RecurrentActorCriticPolicy):
            raise ConfigError(
                "GRPO learns from single steps, so it takes feedforward models only; drop model_config "
                "'core' (recurrent policies train with algo=ppo)."
            )
        self.learner_config = cast(GRPOConfig, self.policy_configs[self.policy_id])
        """The config with the policy's overrides (``policies``) applied: what the learner reads."""
        horizon = config.rollout_fragment_length
        assert horizon is not None  # filled in when the config is validated
        self.buffer = RolloutBuffer(env, horizon, self.extra_fields() | {"advantage": SCALAR}, config.device)
        c = self.learner_config
        self.optimizer = AutogradOptimizer(self.policy, c.learning_rate, c.adam_eps, c.max_grad_norm, self.policy_id)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.num_groups = env.num_envs // config.group_size
        self.iterations = 0
        """Training steps taken: which group seeds the next one draws, and when the reference is refreshed."""
        self.reference = self._frozen_copy() if config.kl_coef > 0 else None
        """The frozen reference policy of the KL penalty (None when ``kl_coef`` is 0)."""

    def make_policy(self, policy_id: str, config: TrainerConfig) -> ActorCriticPolicy:
        """GRPO's policy is the actor-critic ``model`` and ``model_config`` describe; its value head
        goes unused."""
        return build_policy(config, self.env)

    def _frozen_copy(self) -> ActorCriticPolicy:
        reference = copy.deepcopy(self.policy)
        reference.requires_grad_(False)
        return reference

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
        rollout = self.buffer.start_rollout()
        self.collect(collector, rollout, until_done=True)
        self.buffer.add(rollout)
        self.update_obs_stats(rollout)
        steps = transition_view(rollout)
        with torch.no_grad():
            advantage, first, returns = group_relative(
                steps["reward"], steps["done"], steps["valid"], c.group_size, c.adv_eps
            )
            rollout["advantage"][:, :-1] = advantage
        stats = self.group_stats(returns, first, steps["done"])
        if self.policy_id in self.trained_policy_ids:
            lr = self.learning_rate(self.learner_config)
            stats |= {"learning_rate": lr, **self.learn(rollout, first, lr)}
        self.iterations += 1
        return stats

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

    def learn(self, rollout: TensorDict, first: torch.Tensor, learning_rate: float) -> dict[str, float]:
        """Epochs of minibatches of the first-episode steps (``first``, bool ``[N, T]``)."""
        c = self.learner_config
        self.optimizer.lr = learning_rate
        keys = (*LEARN_KEYS, *(("action_mask",) if "action_mask" in rollout.keys() else ()))  # noqa: SIM118 (a TensorDict)
        sampler = FlatSampler(transition_view(rollout.select(*keys)), c.sgd_minibatch_size, self.generator, first)
        if self.reference is not None:
            data = sampler.data  # gathered once: each minibatch indexes it
            with torch.no_grad():
                mask = data.get("action_mask", None)
                data["ref_log_prob"] = self.reference.evaluate(data["obs"], data["action"], False, mask)[0]
        totals = torch.zeros(len(STAT_NAMES))
        epochs = count = 0
        for epochs in range(1, c.num_sgd_iter + 1):
            track = c.target_kl is not None or epochs == c.num_sgd_iter
            totals.zero_()
            count = 0
            for minibatch in sampler:
                out = self._step(minibatch, track)
                if out is not None:
                    totals += out
                count += 1
            if past_target_kl(totals[STAT_NAMES.index("approx_kl")], count, c.target_kl):
                break
        result = dict(zip(STAT_NAMES, (totals / count).tolist()))
        if self.reference is None:
            del result["kl"]
        result["num_sgd_epochs"] = epochs
        return result

    def _step(self, mb: TensorDict, track: bool) -> torch.Tensor | None:
        """Loss, backward and optimizer step of one minibatch; its diagnostics when ``track``."""
        c = self.learner_config
        mask = mb.get("action_mask", None)
        logp, entropy, _ = self.policy.evaluate(mb["obs"], mb["action"], track or c.ent_coef > 0, mask)
        pg_loss, ratio = clipped_surrogate(logp, mb["sample_log_prob"], mb["advantage"], None, c.clip_coef)
        loss = pg_loss
        if c.ent_coef:
            loss = loss - c.ent_coef * cast(torch.Tensor, entropy).mean()
        kl = torch.zeros(())
        if self.reference is not None:
            kl = kl_k3(logp, mb["ref_log_prob"], None)
            loss = loss + c.kl_coef * kl
        self.optimizer.backward(loss)
        self.optimizer.step()
        if not track:
            return None
        with torch.no_grad():
            approx_kl, clipfrac = policy_stats(ratio.detach(), c.clip_coef, None)
            ent = cast(torch.Tensor, entropy).mean()
            return torch.stack([pg_loss.detach(), ent, approx_kl, clipfrac, kl.detach()])

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "iterations": self.iterations,
            "reference": None if self.reference is None else self.reference.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.iterations = state["iterations"]
        if self.reference is not None:
            self.reference.load_state_dict(state["reference"])
