"""PPO, top to bottom (Schulman et al. 2017, arXiv:1707.06347).

The implementation details follow "The 37 Implementation Details of PPO" (Huang et al. 2022):
orthogonal init lives in the model; the learning rate is annealed linearly (``lr_schedule``);
advantages come from GAE (``advantage_estimator``), then shuffled minibatches of single
transitions, per-minibatch advantage normalization (``minibatches``), Adam with its eps, global gradient clipping
and the approx_kl / clipfrac / explained_variance diagnostics; the clipped surrogate, optional
value clipping and the entropy bonus are ``losses.ppo_loss``.

One training step (the loop is ``OnPolicyAlgorithm``'s): collect ``[N, T+1]`` -> the value of
each truncated episode's last observation -> the observation statistics take in the rollout ->
each trained policy, on the steps it took: ``advantages`` over the whole rollout (with its own
``gamma`` and ``gae_lambda``), then ``num_sgd_iter`` epochs of shuffled minibatches, each one
``step``. On the built-in MLP a step is the hand-fused one of ``ppo_fused`` (the same numbers,
about twice as fast on small networks); on any other model it is autograd.

Recurrent models, V-trace, prioritized minibatches and gradient accumulation learn from segments
of the rollout: ``algo=ppo`` hands those configurations to the segment learner
(``ppo_segments.SegmentPPO``), which shares this loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from tensordict import TensorDict

from shoal.algos.base import Statistics
from shoal.algos.losses import PPOTerms, normalize_advantage, ppo_coefficients, ppo_loss, ppo_statistics
from shoal.algos.on_policy import Minibatch, OnPolicyAlgorithm, PolicyLearner, Sampler, advantage_estimator
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.ppo_fused import FusedPPOStep, fused_unavailable
from shoal.config import PPOConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.policy import ActorCriticPolicy

Learner = PolicyLearner[PPOConfig, ActorCriticPolicy, FusedPPOStep | AutogradOptimizer]


class PPOAlgorithm(OnPolicyAlgorithm[PPOConfig, ActorCriticPolicy, FusedPPOStep | AutogradOptimizer]):
    name = "PPO"
    config_class = PPOConfig
    STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac")
    LEARNS_FROM_SEGMENTS: ClassVar[bool] = False
    """Whether the class learns from segments (the segment learner, ``ppo_segments.SegmentPPO``)."""

    @classmethod
    def implementation(
        cls, config: TrainerConfig, env: EnvInfo | None = None
    ) -> type[OnPolicyAlgorithm[Any, Any, Any]]:
        """PPO itself learns from single transitions; ``algo=ppo`` with a configuration that learns
        from segments (``PPOConfig.learns_from_segments``) is the segment learner's."""
        from shoal.algos.ppo_segments import SegmentPPO  # it builds on this module

        if cls is PPOAlgorithm and isinstance(config, PPOConfig) and config.learns_from_segments:
            return SegmentPPO
        return cls

    def __init__(self, config: PPOConfig, env: EnvInfo):
        if (reason := config.learns_from_segments) and not self.LEARNS_FROM_SEGMENTS:
            raise ConfigError(
                f"{type(self).__name__} learns from single transitions; {reason} needs the segment learner: "
                f"subclass shoal.algos.SegmentPPO (algo=ppo picks it by itself)."
            )
        super().__init__(config, env)

    def make_optimizer(self, policy: ActorCriticPolicy, config: PPOConfig) -> FusedPPOStep | AutogradOptimizer:
        """The hand-fused step where it is exactly the autograd one (the built-in MLP, no hooks),
        else Adam on autograd."""
        step = (config.learning_rate, config.adam_eps, config.max_grad_norm)
        if fused_unavailable(policy, config.fused_update) is None:
            return FusedPPOStep(policy, *step)
        return super().make_optimizer(policy, config)

    def advantages(self, learner: Learner, rollout: TensorDict) -> None:
        """By the configured estimator over the whole rollout, and ``return = advantage + value``."""
        c = learner.config
        advantage = advantage_estimator(c.advantage_estimator)(rollout, c.gamma, c.gae_lambda)
        rollout["advantage"][:, :-1] = advantage
        rollout["return"][:, :-1] = advantage + rollout["value"][:, :-1]

    def sampler(self, learner: Learner, rollout: TensorDict, select: torch.Tensor | None) -> Sampler:
        sampler = super().sampler(learner, rollout, select)
        # Advantages are normalized per minibatch (``norm_adv``): here when one minibatch covers the
        # batch (the same one every epoch, so once), else as each is drawn (``minibatches``).
        if learner.config.norm_adv and len(sampler) == 1:
            valid = sampler.data["valid"] if sampler.padded else None
            sampler.data["advantage"] = normalize_advantage(sampler.data["advantage"], valid)
        return sampler

    def minibatches(self, learner: Learner, sampler: Sampler) -> Iterator[Minibatch]:
        """Shuffled transitions, each minibatch's advantages normalized (``norm_adv``)."""
        normalize = learner.config.norm_adv and len(sampler) > 1
        for minibatch in super().minibatches(learner, sampler):
            if normalize:  # a gathered copy: the rollout keeps its advantages
                minibatch.data["advantage"] = normalize_advantage(minibatch.data["advantage"], minibatch.mask)
            yield minibatch

    def step(self, learner: Learner, minibatch: Minibatch, stats: Statistics | None) -> None:
        """Forward, PPO's loss, backward, clipped Adam step on one minibatch of transitions."""
        c, batch, mask = learner.config, minibatch.data, minibatch.mask
        need_entropy = stats is not None or c.ent_coef > 0
        terms: PPOTerms | None
        if isinstance(learner.optimizer, FusedPPOStep):  # the same step with its backward written out
            terms, entropy = learner.optimizer(
                batch, mask=mask, track=stats is not None, need_entropy=need_entropy, **ppo_coefficients(c)
            )
        else:
            log_prob, entropy, value = learner.policy.evaluate(
                batch["obs"],
                batch["action"],
                entropy=need_entropy,
                action_mask=batch.get("action_mask", None),
                critic_obs=batch.get("critic_obs", None),
            )
            terms = ppo_loss(batch, log_prob=log_prob, value=value, entropy=entropy, mask=mask, **ppo_coefficients(c))
            learner.optimizer.backward(terms.loss)
            learner.optimizer.step()
        if stats is not None and terms is not None and entropy is not None:  # the step gives both when tracked
            stats.add(ppo_statistics(terms, entropy, mask, c.clip_coef))

    def learn(self, learner: Learner, rollout: TensorDict, select: torch.Tensor | None) -> dict[str, float]:
        if isinstance(learner.optimizer, FusedPPOStep) and (late := fused_unavailable(learner.policy, True)):
            raise ConfigError(
                f"the policy changed after PPO chose its hand-fused learn step ({late}), which "
                f"would bypass it; build the trainer with fused_update=false to learn on autograd."
            )
        return super().learn(learner, rollout, select)

    def describe(self) -> str:
        return "batch layout:\n" + self.config.layout(self.env.rows_per_env).describe()
