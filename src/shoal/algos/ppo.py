"""PPO, top to bottom (Schulman et al. 2017, arXiv:1707.06347).

The implementation details follow "The 37 Implementation Details of PPO" (Huang et al. 2022):
orthogonal init lives in the model; the learning rate is annealed linearly (``lr_schedule``);
advantages come from GAE (``advantage_estimator``), then shuffled minibatches, per-minibatch
advantage normalization, Adam with its eps, global gradient clipping and the approx_kl /
clipfrac / explained_variance diagnostics; the clipped surrogate, optional value clipping and
the entropy bonus are ``ppo_loss``.

One training step: collect ``[N, T+1]`` (and each recurrent policy's state at every segment
start) -> value of each truncated episode's last observation -> update the observation
statistics with this rollout -> each trained policy: advantages over the whole rollout (with its
own ``gamma`` and ``gae_lambda``), then epochs of minibatches from its own steps: single
transitions, or ``[segments, bptt_horizon]`` for recurrent policies, V-trace and prioritized
minibatches (``PPOLearner``). A minibatch step runs on autograd, or on the hand-fused step of
``ppo_fused`` for the built-in MLP (the same numbers, about twice as fast on small networks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from tensordict import TensorDict

from shoal.algos.advantages import advantage_estimator, vtrace
from shoal.algos.base import SCALAR, Algorithm, Collector
from shoal.algos.losses import (
    LossArgs,
    LossOutputs,
    advantage_stats,
    explained_variance,
    masked_mean,
    normalize_advantage,
    past_target_kl,
    policy_stats,
    ppo_loss,
)
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.ppo_fused import FusedPPOStep, fused_unavailable
from shoal.buffers import FlatSampler, RolloutBuffer, SegmentSampler, transition_view
from shoal.config import PPOConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import build_policy
from shoal.models.policy import ActorCriticPolicy
from shoal.models.recurrent import RecurrentActorCriticPolicy

if TYPE_CHECKING:
    from shoal.collect.collector import Truncations

STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac")
LEARN_KEYS = ("obs", "action", "sample_log_prob", "value", "return", "advantage", "valid")
# what segments add: episode starts (recurrent resets) and what V-trace recomputes advantages from
SEGMENT_KEYS = ("first", "reward", "terminated", "truncated", "final_value", "raw_reward")


class PPOAlgorithm(Algorithm):
    name = "PPO"
    config_class = PPOConfig
    extras = ("sample_log_prob", "value")  # stored per step: the behaviour policy's log-prob, the value

    config: PPOConfig  # built from config_class by the trainer

    def __init__(self, config: PPOConfig, env: EnvInfo):
        super().__init__(config, env)
        fields = self.extra_fields() | dict.fromkeys(("final_value", "advantage", "return"), SCALAR)
        if any(getattr(getattr(policy, "model", None), "prev_reward", False) for policy in self.policies.values()):
            fields["raw_reward"] = SCALAR  # the env's own rewards, which such a core reads as the previous reward
        initial = [policy.initial_state(1) for policy in self.policies.values()]
        capacity = config.rollout_capacity
        self.buffer = RolloutBuffer(env, capacity, fields, config.device, config.segment_length, initial)
        self.learners = {
            pid: PPOLearner(
                # built by make_policy from the config_class (with the policy's overrides)
                cast(ActorCriticPolicy, self.policies[pid]),
                cast(PPOConfig, self.policy_configs[pid]),
                torch.Generator().manual_seed(config.seed + i),
            )
            for i, pid in enumerate(config.policy_ids)
            if pid in self.trained_policy_ids
        }

    def make_policy(self, policy_id: str, config: TrainerConfig) -> ActorCriticPolicy:
        """PPO learns an actor-critic: by default the one ``model`` and ``model_config`` describe."""
        return build_policy(config, self.env)

    def training_step(self, collector: Collector) -> dict[str, Any]:
        rollout = self.buffer.start_rollout()
        self.collect(collector, rollout, self.buffer.start_states)
        self.buffer.add(rollout)
        # Truncated episodes' final values are taken with the statistics the rollout was acted on,
        # like its stored values. Then the observation statistics take in this rollout before
        # learning from it: they move little once a few rollouts are in, and waiting a rollout to
        # use them makes the first iterations learn from unnormalized inputs.
        assert collector.truncations is not None  # collect() sets them
        self.bootstrap_truncations(rollout, collector.truncations)
        self.update_obs_stats(rollout)
        # Each trained policy learns from the steps it took; one policy's statistics are top-level
        # result keys, several go under "learner" as "<policy>/<stat>".
        single = len(self.policies) == 1
        # complete episodes leave padding after each row's last episode: minibatches gather the real steps
        valid = rollout["valid"][:, :-1] if self.config.batch_mode == "complete_episodes" else None
        stats: dict[str, Any] = {}
        for pid, learner in self.learners.items():
            index = list(self.policies).index(pid)
            select = valid if single else rollout["policy_id"][:, :-1] == index
            if valid is not None and select is not valid:
                select &= valid
            if select is not None and not select.any():
                continue  # the mapping gave this policy no rows this iteration
            lr = self.learning_rate(learner.config)
            starts = None if self.buffer.start_states is None else self.buffer.start_states[index]
            out = {"learning_rate": lr, **learner.update(rollout, lr, select, starts, self.prio_beta(learner.config))}
            stats |= out if single else {f"{pid}/{k}": v for k, v in out.items()}
        return stats if single else {"learner": stats}

    def prio_beta(self, config: PPOConfig) -> float:
        """The importance-weight exponent of prioritized minibatches: ``prio_beta0`` rising linearly
        to 1 at the end of each ``learn()`` call (reached by its last iteration)."""
        return config.prio_beta0 + (1.0 - config.prio_beta0) * self.progress_end

    def describe(self) -> str:
        return "batch layout:\n" + self.config.layout(self.env.rows_per_env).describe()

    def data_parallel_problem(self) -> str | None:
        if self.config.batch_mode == "complete_episodes":
            return (
                "batch_mode='complete_episodes': each rank's iteration holds a different number of steps, and so "
                "of minibatches, while every rank must take the same optimizer steps"
            )
        if len(self.learners) > 1:
            return (
                f"PPO with several trained policies ({', '.join(self.learners)}): a rank's share of each policy's "
                f"steps, and so its number of minibatches, differs from rank to rank"
            )
        return None

    @torch.no_grad()
    def bootstrap_truncations(self, rollout: TensorDict, truncations: Truncations) -> None:
        """``final_value`` at each truncated step: the acting policy's value of the episode's true
        last observation (the next slot already holds the next episode's first), seen with the
        state the policy had then. With next-step autoreset the rollout's next step is that
        observation, and its stored value is that value."""
        if not len(truncations):
            return
        row, step = truncations.row, truncations.step
        if truncations.next_step:
            rollout["final_value"][row, step] = rollout["value"][row, step + 1]
            return
        owner = rollout["policy_id"][row, step]
        for index, policy in enumerate(self.policies.values()):
            mine = (owner == index).nonzero().squeeze(1)
            if len(mine):
                critic = None if truncations.critic_obs is None else truncations.critic_obs[mine]
                state = truncations.states[index][mine] if truncations.states else None
                value = cast(ActorCriticPolicy, policy).value(truncations.obs[mine], critic, state)
                rollout["final_value"][row[mine], step[mine]] = value

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "learners": {pid: lr.state_dict() for pid, lr in self.learners.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for pid, learner in self.learners.items():
            learner.load_state_dict(state["learners"][pid])


class Minibatch(NamedTuple):
    """What one minibatch step learns from: transitions ``[B]`` or segments ``[S, L]`` (with
    their start states for a recurrent policy) and, when drawn by priority, importance weights
    ``[S]``."""

    data: TensorDict
    start_states: TensorDict | None
    weights: torch.Tensor | None
    segment_index: torch.Tensor | None  # which segments of the sampler's data (None: all, or flat transitions)


class PPOLearner:
    """One policy's optimizer, minibatch sampler and update.

    Feedforward policies learn from shuffled transitions (``FlatSampler``). Recurrent policies,
    prioritized minibatches and V-trace learn from whole segments (``SegmentSampler``): a
    recurrent policy replays each from its stored start state, V-trace recomputes each
    minibatch's advantages with the current policy's ratios, bootstrapped at the segment end from
    the stored value of the next step. Every ``accumulate_minibatches`` minibatches make one
    optimizer step: their losses are weighted by their share of the valid steps and their
    advantages normalized together, so the step is the one a single minibatch of them all would
    take. The hand-fused step (``ppo_fused``) serves the plain case: the built-in MLP, flat
    transitions, GAE, one minibatch per step.
    """

    def __init__(self, policy: ActorCriticPolicy, config: PPOConfig, generator: torch.Generator | None = None):
        self.policy, self.config, self.generator = policy, config, generator
        self.advantage = advantage_estimator(config.advantage_estimator)
        self.vtrace = config.advantage_estimator == "vtrace"
        self.recurrent = isinstance(policy, RecurrentActorCriticPolicy)
        self.segments = self.recurrent or self.vtrace or config.prio_alpha > 0
        self.coefs = (config.clip_coef, config.vf_clip_coef, config.vf_coef, config.ent_coef)
        self.fused_off_reason = fused_unavailable(policy, config.fused_update) or self._needs_autograd()
        step = (config.learning_rate, config.adam_eps, config.max_grad_norm)
        # exactly one of the two steps the parameters
        self.fused = FusedPPOStep(policy, *step) if self.fused_off_reason is None else None
        self.optimizer = AutogradOptimizer(policy, *step, policy.policy_id) if self.fused is None else None

    def _needs_autograd(self) -> str | None:
        c = self.config
        if c.accumulate_minibatches > 1:
            return f"accumulate_minibatches={c.accumulate_minibatches}"
        if self.segments:
            return "minibatches of segments (a recurrent core, V-trace or prioritized minibatches)"
        return None

    @property
    def step(self) -> FusedPPOStep | AutogradOptimizer:
        """Whichever of the two steps the parameters."""
        return cast("FusedPPOStep | AutogradOptimizer", self.fused or self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.step.state_dict(),
            "generator": None if self.generator is None else self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step.load_state_dict(state["optimizer"])
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    def update(
        self,
        rollout: TensorDict,
        learning_rate: float,
        select: torch.Tensor | None = None,
        start_states: TensorDict | None = None,
        prio_beta: float = 1.0,
    ) -> dict[str, float]:
        """One PPO update on a full ``[N, T+1]`` rollout, or on its steps ``select`` (bool ``[N, T]``:
        the steps this learner's policy took); returns loss statistics. ``start_states``: the
        policy's state ``[N, K]`` at each segment start (recurrent policies); ``prio_beta``: the
        importance-weight exponent of prioritized minibatches.

        Advantages are computed over whole rows either way: a row changes policy only between
        episodes, where GAE does not bootstrap."""
        c = self.config
        if self.fused is not None and (late := fused_unavailable(self.policy, True)):
            raise ConfigError(
                f"the policy changed after PPO chose its hand-fused learn step ({late}), which "
                f"would bypass it; build the trainer with fused_update=false to learn on autograd."
            )
        self.step.lr = learning_rate

        # 1. Advantages and returns on the whole rollout (V-trace at ratio 1 is GAE).
        with torch.no_grad():
            advantage = self.advantage(rollout, c.gamma, c.gae_lambda)
            rollout["advantage"][:, :-1] = advantage
            rollout["return"][:, :-1] = advantage + rollout["value"][:, :-1]
        optional = ("action_mask", "critic_obs", *(SEGMENT_KEYS if self.segments else ()))
        keys = (*LEARN_KEYS, *(key for key in optional if key in rollout.keys()))  # noqa: SIM118 (a TensorDict)
        data = transition_view(rollout.select(*keys))
        if self.segments:
            data = data.clone()  # the segment sampler reshapes it: copy once, with the next values alongside
            data["next_value"] = rollout["value"][:, 1:]
            length = c.segment_length
            sampler: FlatSampler | SegmentSampler = SegmentSampler(
                data, length, max(1, c.sgd_minibatch_size // length), self.generator, select, start_states
            )
            if self.vtrace and c.prio_alpha > 0:  # each segment's ratios as last seen (1: not yet), for priorities
                sampler.data["ratio"] = torch.ones_like(sampler.data["value"])
        else:
            sampler = FlatSampler(data, c.sgd_minibatch_size, self.generator, select)
        data = sampler.data
        mask_all = None if bool(data["valid"].all()) else data["valid"]  # padding exists only with some backends
        # One minibatch per epoch sees the same rows every epoch: normalize their advantages once.
        normalize_once = c.norm_adv and len(sampler) == 1 and not self.vtrace
        if normalize_once:
            data["advantage"] = normalize_advantage(data["advantage"], mask_all)

        # 2. Epochs of minibatches. Diagnostics are kept for the last epoch (and for every epoch
        #    when target_kl needs them): they cost a dozen ops per minibatch.
        totals = torch.zeros(len(STAT_NAMES))
        sgd_steps = epochs = epoch_steps = 0
        for epochs in range(1, c.num_sgd_iter + 1):
            track = c.target_kl is not None or epochs == c.num_sgd_iter
            totals.zero_()
            epoch_steps = 0
            for group in self._epoch(sampler, data, prio_beta):
                stats = None
                if c.norm_adv and not normalize_once and len(group) > 1:
                    stats = self._group_stats(group, mask_all is not None)
                counts = [mb.data["valid"].sum() if mask_all is not None else mb.data.numel() for mb in group]
                for mb, count in zip(group, counts):
                    share = count / sum(counts)
                    out = self._learn(mb, data, track, normalize_once, stats, share, mask_all is not None)
                    if out is not None:
                        totals += out
                    epoch_steps += 1
                if self.optimizer is not None:
                    self.optimizer.step()
            sgd_steps += epoch_steps
            if past_target_kl(totals[3], epoch_steps, c.target_kl):
                break

        result = dict(zip(STAT_NAMES, (totals / epoch_steps).tolist()))
        value, returns = data["value"], data["return"]
        if mask_all is not None:
            value, returns = value[mask_all], returns[mask_all]
        result["explained_variance"] = explained_variance(value, returns)
        result["num_sgd_epochs"] = epochs
        result["num_sgd_steps"] = sgd_steps // c.accumulate_minibatches
        return result

    def _epoch(
        self, sampler: FlatSampler | SegmentSampler, data: TensorDict, prio_beta: float
    ) -> Iterator[list[Minibatch]]:
        """One epoch's minibatches, in groups of ``accumulate_minibatches`` (one optimizer step each)."""
        c = self.config
        if isinstance(sampler, FlatSampler):
            minibatches: Iterator[Minibatch] = (Minibatch(mb, None, None, None) for mb in sampler)
        else:
            priority = None
            if c.prio_alpha > 0:
                if self.vtrace:  # the latest ratios each segment was seen with
                    data["advantage"] = self._segment_vtrace(data, data["ratio"])
                priority = (data["advantage"].abs() * data["valid"]).sum(1)
            minibatches = (
                Minibatch(*sampler.minibatch(index), weights, index)
                for index, weights in sampler.epoch(priority, c.prio_alpha, prio_beta)
            )
        group: list[Minibatch] = []
        for mb in minibatches:
            group.append(mb)
            if len(group) == c.accumulate_minibatches:
                yield group
                group = []
        if group:
            yield group

    def _group_stats(self, group: list[Minibatch], masked: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantage mean and std over all the minibatches of one optimizer step (as stored at the
        epoch's start: V-trace's fresh advantages are normalized with them too)."""
        adv = torch.cat([mb.data["advantage"].reshape(-1) for mb in group])
        mask = torch.cat([mb.data["valid"].reshape(-1) for mb in group]) if masked else None
        return advantage_stats(adv, mask)

    def _learn(
        self,
        mb: Minibatch,
        segments: TensorDict,
        track: bool,
        normalized: bool,
        stats: tuple[torch.Tensor, torch.Tensor] | None,
        share: torch.Tensor | float,
        masked: bool,
    ) -> torch.Tensor | None:
        """Forward and backward of one minibatch (the fused step also steps the optimizer);
        returns its diagnostics when ``track``."""
        c = self.config
        data = mb.data
        mask = data["valid"] if masked else None
        need_entropy = track or c.ent_coef > 0
        if self.fused is not None:
            adv = data["advantage"]
            if c.norm_adv and not normalized:
                adv = normalize_advantage(adv, mask)
            args: LossArgs = (data["sample_log_prob"], adv, data["value"], data["return"], mask, *self.coefs)
            outputs, entropy = self.fused(data, args, track, need_entropy)
        else:
            logp, entropy, value = self._evaluate(mb, need_entropy)
            adv, returns = data["advantage"], data["return"]
            if self.vtrace:
                with torch.no_grad():
                    ratio = (logp - data["sample_log_prob"]).exp()
                    adv = self._segment_vtrace(data, ratio)
                    returns = adv + data["value"]
                    if "ratio" in segments.keys():  # noqa: SIM118 (a TensorDict): kept for the next epoch's priorities
                        index = slice(None) if mb.segment_index is None else mb.segment_index
                        segments["ratio"][index] = ratio
            if c.norm_adv and not normalized:
                adv = normalize_advantage(adv, mask, stats=stats)
            if mb.weights is not None:
                adv = adv * mb.weights.unsqueeze(1)
            args = (data["sample_log_prob"], adv, data["value"], returns, mask, *self.coefs)
            outputs = ppo_loss(logp, value, entropy, *args)
            cast(AutogradOptimizer, self.optimizer).backward(outputs[0] * share)  # set when not fused
        if not track:
            return None
        _, ratio, pg_loss, v_loss = cast(LossOutputs, outputs)  # the steps give them when track
        with torch.no_grad():
            approx_kl, clipfrac = policy_stats(ratio, c.clip_coef, mask)
            ent = masked_mean(cast(torch.Tensor, entropy), mask)
            return torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac])

    def _evaluate(self, mb: Minibatch, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probabilities, entropies and values of the minibatch's steps under the current
        policy, shaped like the minibatch: segments replayed from their start states for a
        recurrent policy, single steps otherwise."""
        data = mb.data
        mask = data.get("action_mask", None)
        if self.recurrent:
            policy = cast(RecurrentActorCriticPolicy, self.policy)
            start = cast(TensorDict, mb.start_states)  # stored for every recurrent policy
            return policy.evaluate_segments(
                data["obs"], data["action"], data["first"], start, entropy, mask, data.get("raw_reward", None)
            )
        flat = data.reshape(-1)
        logp, ent, value = self.policy.evaluate(
            flat["obs"],
            flat["action"],
            entropy=entropy,
            action_mask=None if mask is None else flat["action_mask"],
            critic_obs=flat.get("critic_obs", None),
        )
        shape = data.batch_size
        return logp.view(shape), None if ent is None else ent.view(shape), value.view(shape)

    def _segment_vtrace(self, data: TensorDict, ratio: torch.Tensor) -> torch.Tensor:
        """V-trace advantages of segments ``[S, L]`` with importance ratios ``ratio``, bootstrapped
        at each segment's end from the stored value of the step after it."""
        c = self.config
        value = torch.cat((data["value"], data["next_value"][:, -1:]), dim=1)
        valid = data["valid"]
        return vtrace(
            data["reward"],
            value,
            data["terminated"],
            data["truncated"],
            data["final_value"],
            ratio,
            c.gamma,
            c.gae_lambda,
            c.vtrace_rho_clip,
            c.vtrace_c_clip,
            valid_t=None if bool(valid.all()) else valid,
        )
