"""PPO's segment learner: PPO on ``[segments, bptt_horizon]`` views of the rollout.

It learns with PPO's loss and advantages (``ppo.py``) from whole segments of each row instead of
single transitions, which four things need (``algo=ppo`` comes here when any is asked for):

- **Recurrent policies** (a ``model_config`` ``core``) replay each segment from the state stored
  at its start, backpropagating through it (BPTT over ``bptt_horizon`` steps).
- **V-trace** (IMPALA, Espeholt et al. 2018, arXiv:1802.01561): each minibatch's advantages are
  recomputed with the current policy's importance ratios, bootstrapped at the segment's end from
  the stored value of the step after it.
- **Prioritized minibatches**: segments are drawn with probability ``p_i`` proportional to
  ``(sum of |advantage|) ** prio_alpha``, and weighted by ``(M p_i) ** -beta`` (M segments), with
  beta rising from ``prio_beta0`` to 1 over each ``learn()`` call. The weights are not divided by
  their maximum (as prioritized replay does): at beta 1 the weighted loss is then an unbiased
  estimate of the uniformly drawn one at the same scale, so ``prio_alpha`` does not also shrink
  the step size.
- **Gradient accumulation**: every ``accumulate_minibatches`` minibatches make one optimizer step;
  their losses are weighted by their share of the valid steps and their advantages normalized
  together, so the step is the one a single minibatch of them all would take.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from tensordict import TensorDict

from shoal.algos.base import SCALAR, Statistics
from shoal.algos.losses import advantage_stats, normalize_advantage, ppo_coefficients, ppo_loss, ppo_statistics
from shoal.algos.on_policy import Minibatch, Sampler, decisions
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.ppo import Learner, PPOAlgorithm
from shoal.algos.returns import importance_weights, vtrace
from shoal.buffers import RolloutBuffer, SegmentSampler, transition_view
from shoal.buffers.rollout import FieldSpec
from shoal.config import PPOConfig
from shoal.models.policy import ActorCriticPolicy
from shoal.models.recurrent import RecurrentActorCriticPolicy

VTRACE_KEYS = ("reward", "terminated", "truncated", "final_value")  # what V-trace recomputes advantages from


class SegmentPPO(PPOAlgorithm):
    """PPO's loss and advantages (inherited) on segments: this class replaces how minibatches are
    drawn (``sampler``, ``minibatches``) and what one step does (``step``)."""

    LEARNS_FROM_SEGMENTS = True

    def rollout_fields(self) -> dict[str, FieldSpec]:
        fields = super().rollout_fields()
        if any(getattr(getattr(policy, "model", None), "prev_reward", False) for policy in self.policies.values()):
            fields["raw_reward"] = SCALAR  # the env's own rewards, which such a core reads as the previous reward
        return fields

    def make_buffer(self) -> RolloutBuffer:
        """The rollout, with each recurrent policy's state stored at every segment start (a state
        only carried from step to step, as gSDE's noise, is not replayed)."""
        c = self.config
        initial = [
            policy.initial_state(1) if isinstance(policy, RecurrentActorCriticPolicy) else TensorDict({}, [1])
            for policy in self.policies.values()
        ]
        return RolloutBuffer(self.env, c.rollout_capacity, self.rollout_fields(), c.device, c.segment_length, initial)

    def make_optimizer(self, policy: ActorCriticPolicy, config: PPOConfig) -> AutogradOptimizer:
        """Adam on autograd: segments replay through the model, which the hand-fused step does not."""
        return AutogradOptimizer(policy, config.learning_rate, config.adam_eps, config.max_grad_norm, policy.policy_id)

    def learn_keys(self, rollout: TensorDict) -> tuple[str, ...]:
        """Beside PPO's: episode starts (a recurrent core resets there), the env's own rewards (a
        core that reads the previous one), and what V-trace recomputes advantages from."""
        present = rollout.keys()
        keys = [*super().learn_keys(rollout), "first", *(["raw_reward"] if "raw_reward" in present else [])]
        if self.config.advantage_estimator == "vtrace":
            keys += VTRACE_KEYS
        return tuple(keys)

    def sampler(self, learner: Learner, rollout: TensorDict, select: torch.Tensor | None) -> SegmentSampler:
        c = learner.config
        data = transition_view(rollout.select(*self.learn_keys(rollout))).clone()  # the sampler reshapes it
        if c.advantage_estimator == "vtrace":  # bootstrapped at each segment's end from the next step's value
            data["next_value"] = rollout["value"][:, 1:]
        starts = None if self.buffer.start_states is None else self.buffer.start_states[learner.index]
        length = self.segment_length(learner)
        sampler = SegmentSampler(
            data, length, max(1, c.sgd_minibatch_size // length), learner.generator, select, starts
        )
        if c.advantage_estimator == "vtrace" and c.prio_alpha > 0:
            sampler.data["ratio"] = torch.ones_like(sampler.data["value"])  # as last seen (1: not yet), for priorities
        return sampler

    def segment_length(self, learner: Learner) -> int:
        """Steps per segment: ``segment_length`` where whole segments are needed (a recurrent policy,
        V-trace, prioritized segments), else 1: accumulation alone draws single transitions, as PPO
        does (a segment sampler of one-step segments draws exactly what ``FlatSampler`` would)."""
        c = learner.config
        recurrent = isinstance(learner.policy, RecurrentActorCriticPolicy)
        return c.segment_length if recurrent or c.advantage_estimator == "vtrace" or c.prio_alpha > 0 else 1

    def minibatches(self, learner: Learner, sampler: Sampler) -> Iterator[Minibatch]:
        """One epoch of segments, shuffled or drawn by priority, in groups of
        ``accumulate_minibatches`` (one optimizer step each)."""
        assert isinstance(sampler, SegmentSampler)  # sampler() made it
        c = learner.config
        segments = sampler.data
        keep_ratios = "ratio" in segments.keys()  # noqa: SIM118 (a TensorDict)
        drawn = (
            self.minibatch(sampler, index, probability, c)
            for index, probability in sampler.epoch(self.priorities(learner, segments), c.prio_alpha)
        )
        for group in iter(lambda: list(itertools.islice(drawn, c.accumulate_minibatches)), []):
            for minibatch in accumulated(group, c.norm_adv):
                yield minibatch  # the step runs here, before the generator resumes
                if keep_ratios:  # the ratios the step saw, for the next epoch's priorities
                    at = slice(None) if minibatch.index is None else minibatch.index
                    segments["ratio"][at] = minibatch.data["ratio"]

    def minibatch(
        self, sampler: SegmentSampler, index: torch.Tensor | None, probability: torch.Tensor | None, config: PPOConfig
    ) -> Minibatch:
        """The segments ``index`` names, weighted when they were drawn by priority."""
        data, starts = sampler.minibatch(index)
        weights = None
        if probability is not None:
            weights = importance_weights(probability, size=len(sampler.data), beta=self.prio_beta(config))
        return Minibatch(data, data["valid"] if sampler.padded else None, starts, index, weights)

    def prio_beta(self, config: PPOConfig) -> float:
        """The importance-weight exponent: ``prio_beta0`` rising linearly to 1 at the end of each
        ``learn()`` call (reached by its last iteration)."""
        return config.prio_beta0 + (1.0 - config.prio_beta0) * self.progress_end

    @torch.no_grad()
    def priorities(self, learner: Learner, segments: TensorDict) -> torch.Tensor | None:
        """Each segment's summed absolute advantage (with V-trace, under the ratios it was last
        seen with); None without prioritized minibatches."""
        c = learner.config
        if c.prio_alpha == 0:
            return None
        if c.advantage_estimator == "vtrace":
            segments["advantage"] = segment_vtrace(segments, segments["ratio"], c)
        priority: torch.Tensor = (segments["advantage"].abs() * segments["valid"]).sum(1)
        return priority

    def step(self, learner: Learner, minibatch: Minibatch, stats: Statistics | None) -> None:
        """Forward (replaying a recurrent policy from each segment's start state), V-trace's fresh
        advantages, PPO's loss weighted by the minibatch's share, backward, and the optimizer step
        at the end of the accumulated group."""
        c, batch, mask = learner.config, minibatch.data, minibatch.mask
        log_prob, entropy, value = self.evaluate(learner, minibatch, need_entropy=stats is not None or c.ent_coef > 0)
        if c.advantage_estimator == "vtrace":
            with torch.no_grad():
                ratio = (log_prob - batch["sample_log_prob"]).exp()
                batch["advantage"] = segment_vtrace(batch, ratio, c)
                batch["return"] = batch["advantage"] + batch["value"]
                if "ratio" in batch.keys():  # noqa: SIM118 (a TensorDict)
                    batch["ratio"] = ratio
        advantage = batch["advantage"]
        if c.norm_adv:
            advantage = normalize_advantage(advantage, mask, stats=minibatch.advantage_stats)
        if minibatch.weights is not None:
            advantage = advantage * minibatch.weights.unsqueeze(1)
        batch["advantage"] = advantage
        terms = ppo_loss(batch, log_prob=log_prob, value=value, entropy=entropy, mask=mask, **ppo_coefficients(c))
        assert isinstance(learner.optimizer, AutogradOptimizer)  # make_optimizer's
        learner.optimizer.backward(terms.loss * minibatch.share)
        if minibatch.ends_step:
            learner.optimizer.step()
        if stats is not None and entropy is not None:
            stats.add(ppo_statistics(terms, entropy, mask, c.clip_coef))

    def evaluate(
        self, learner: Learner, minibatch: Minibatch, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probabilities, entropies and values ``[S, L]`` of the minibatch's steps under the
        current policy: replayed from each segment's start state for a recurrent policy, single
        steps otherwise."""
        data, policy = minibatch.data, learner.policy
        mask = data.get("action_mask", None)
        if isinstance(policy, RecurrentActorCriticPolicy):
            assert minibatch.start_states is not None  # stored for every recurrent policy
            return policy.evaluate_segments(
                data["obs"],
                data["action"],
                data["first"],
                minibatch.start_states,
                entropy=need_entropy,
                action_mask=mask,
                reward=data.get("raw_reward", None),
            )
        flat = data.reshape(-1)
        log_prob, entropy, value = policy.evaluate(
            flat["obs"],
            flat["action"],
            entropy=need_entropy,
            action_mask=None if mask is None else flat["action_mask"],
            critic_obs=flat.get("critic_obs", None),
        )
        shape = data.batch_size
        return log_prob.view(shape), None if entropy is None else entropy.view(shape), value.view(shape)


def accumulated(group: list[Minibatch], normalize: bool) -> list[Minibatch]:
    """The minibatches of one optimizer step, each given its share of the step's valid steps and,
    when advantages are ``normalize``d, the advantage mean and std of them all (as stored at the
    epoch's start: V-trace's fresh advantages are normalized with them too)."""
    if not group:
        return group
    counts = [mb.data["valid"].sum() if mb.mask is not None else mb.data.numel() for mb in group]
    total = sum(counts)
    stats = None
    if normalize and len(group) > 1:
        advantage = torch.cat([mb.data["advantage"].reshape(-1) for mb in group])
        masked = group[0].mask is not None
        mask = torch.cat([mb.data["valid"].reshape(-1) for mb in group]) if masked else None
        stats = advantage_stats(advantage, mask)
    for mb, count in zip(group, counts):
        mb.share, mb.advantage_stats, mb.ends_step = count / total, stats, mb is group[-1]
    return group


def segment_vtrace(segments: TensorDict, ratio: torch.Tensor, config: PPOConfig) -> torch.Tensor:
    """V-trace advantages of segments ``[S, L]`` with importance ratios ``ratio``, bootstrapped at
    each segment's end from the stored value of the step after it."""
    value = torch.cat((segments["value"], segments["next_value"][:, -1:]), dim=1)
    return vtrace(
        segments["reward"],
        value,
        segments["terminated"],
        segments["truncated"],
        segments["final_value"],
        ratio,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
        rho_clip=config.vtrace_rho_clip,
        c_clip=config.vtrace_c_clip,
        valid_t=decisions(segments["valid"]),
    )
