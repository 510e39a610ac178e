"""PPO, top to bottom (Schulman et al. 2017, arXiv:1707.06347).

The implementation details follow "The 37 Implementation Details of PPO" (Huang et al. 2022):
orthogonal init lives in the model; the learning rate is annealed linearly (``lr_schedule``);
advantages come from GAE (``advantage_estimator``), then shuffled minibatches, per-minibatch
advantage normalization, Adam with its eps, global gradient clipping and the approx_kl /
clipfrac / explained_variance diagnostics; the clipped surrogate, optional value clipping and
the entropy bonus are ``ppo_loss``.

One training step: collect ``[N, T+1]`` -> value of each truncated episode's last observation
-> update the observation statistics with this rollout -> each trained policy: advantages over
the whole rollout (with its own ``gamma`` and ``gae_lambda``), then epochs of minibatches from
its own steps. A minibatch step runs on autograd, or on the hand-fused step of ``ppo_fused`` for
the built-in MLP (the same numbers, about twice as fast on small networks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from tensordict import TensorDict

from shoal.algos.advantages import advantage_estimator
from shoal.algos.base import SCALAR, Algorithm, Collector
from shoal.algos.losses import (
    LossArgs,
    LossOutputs,
    explained_variance,
    masked_mean,
    normalize_advantage,
    policy_stats,
    ppo_loss,
)
from shoal.algos.ppo_fused import FusedPPOStep, fused_unavailable
from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.config import PPOConfig, TrainerConfig
from shoal.envs.spaces import EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import build_policy
from shoal.models.policy import ActorCriticPolicy

if TYPE_CHECKING:
    from shoal.collect.collector import Truncations

STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac")
LEARN_KEYS = ("obs", "action", "sample_log_prob", "value", "return", "advantage", "valid")


class PPOAlgorithm(Algorithm):
    name = "PPO"
    config_class = PPOConfig
    extras = ("sample_log_prob", "value")  # stored per step: the behaviour policy's log-prob, the value

    config: PPOConfig  # built from config_class by the trainer

    def __init__(self, config: PPOConfig, env: EnvInfo):
        super().__init__(config, env)
        fields = self.extra_fields() | dict.fromkeys(("final_value", "advantage", "return"), SCALAR)
        horizon = config.rollout_fragment_length
        assert horizon is not None  # filled in when the config is validated
        self.buffer = RolloutBuffer(env, horizon, fields, config.device)
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
        collector.collect(rollout)
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
        stats: dict[str, Any] = {}
        for pid, learner in self.learners.items():
            select = None if single else rollout["policy_id"][:, :-1] == list(self.policies).index(pid)
            if select is not None and not select.any():
                continue  # the mapping gave this policy no rows this iteration
            lr = self.learning_rate(learner.config)
            out = {"learning_rate": lr, **learner.update(rollout, lr, select)}
            stats |= out if single else {f"{pid}/{k}": v for k, v in out.items()}
        return stats if single else {"learner": stats}

    @torch.no_grad()
    def bootstrap_truncations(self, rollout: TensorDict, truncations: Truncations) -> None:
        """``final_value`` at each truncated step: the acting policy's value of the episode's true
        last observation (the next slot already holds the next episode's first)."""
        if not len(truncations):
            return
        owner = rollout["policy_id"][truncations.row, truncations.step]
        for index, policy in enumerate(self.policies.values()):
            mine = (owner == index).nonzero().squeeze(1)
            if len(mine):
                critic = None if truncations.critic_obs is None else truncations.critic_obs[mine]
                value = cast(ActorCriticPolicy, policy).value(truncations.obs[mine], critic)
                rollout["final_value"][truncations.row[mine], truncations.step[mine]] = value

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "learners": {pid: lr.state_dict() for pid, lr in self.learners.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for pid, learner in self.learners.items():
            learner.load_state_dict(state["learners"][pid])


class PPOStep(Protocol):
    """One minibatch step of PPO: ``AutogradPPOStep``, or ``FusedPPOStep`` for the built-in MLP."""

    lr: float

    def __call__(
        self, mb: TensorDict, loss_args: LossArgs, track: bool, need_entropy: bool
    ) -> tuple[LossOutputs | None, torch.Tensor | None]:
        """Learn from ``mb``; returns the loss outputs (always when ``track``) and the entropy
        (always when ``need_entropy``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PPOLearner:
    """One policy's optimizer, minibatch generator and update."""

    def __init__(self, policy: ActorCriticPolicy, config: PPOConfig, generator: torch.Generator | None = None):
        self.policy, self.config, self.generator = policy, config, generator
        self.advantage = advantage_estimator(config.advantage_estimator)
        self.fused_off_reason = fused_unavailable(policy, config.fused_update)
        make_step = AutogradPPOStep if self.fused_off_reason else FusedPPOStep
        self.step: PPOStep = make_step(policy, config.learning_rate, config.adam_eps, config.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.step.state_dict(),
            "generator": None if self.generator is None else self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step.load_state_dict(state["optimizer"])
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    def update(self, rollout: TensorDict, learning_rate: float, select: torch.Tensor | None = None) -> dict[str, float]:
        """One PPO update on a full ``[N, T+1]`` rollout, or on its steps ``select`` (bool ``[N, T]``:
        the steps this learner's policy took); returns loss statistics.

        Advantages are computed over whole rows either way: a row changes policy only between
        episodes, where GAE does not bootstrap."""
        c = self.config
        if self.fused_off_reason is None and (late := fused_unavailable(self.policy, True)):
            raise ConfigError(
                f"the policy changed after PPO chose its hand-fused learn step ({late}), which "
                f"would bypass it; build the trainer with fused_update=false to learn on autograd."
            )
        self.step.lr = learning_rate

        # 1. Advantages and returns on the whole rollout.
        with torch.no_grad():
            advantage = self.advantage(rollout, c.gamma, c.gae_lambda)
            rollout["advantage"][:, :-1] = advantage
            rollout["return"][:, :-1] = advantage + rollout["value"][:, :-1]
        keys = (*LEARN_KEYS, *(key for key in ("action_mask", "critic_obs") if key in rollout.keys()))  # noqa: SIM118 (a TensorDict)
        sampler = FlatSampler(transition_view(rollout.select(*keys)), c.sgd_minibatch_size, self.generator, select)
        data = sampler.data
        mask_all = None if bool(data["valid"].all()) else data["valid"]  # padding exists only with some backends
        # One minibatch per epoch sees the same rows every epoch: normalize their advantages once.
        normalize_once = c.norm_adv and len(sampler) == 1
        if normalize_once:
            data["advantage"] = normalize_advantage(data["advantage"], mask_all)

        # 2. Epochs of shuffled minibatches. Diagnostics are kept for the last epoch (and for
        #    every epoch when target_kl needs them): they cost a dozen ops per minibatch.
        totals = torch.zeros(len(STAT_NAMES))
        sgd_steps = epochs = epoch_steps = 0
        for epochs in range(1, c.num_sgd_iter + 1):
            track = c.target_kl is not None or epochs == c.num_sgd_iter
            totals.zero_()
            epoch_steps = 0
            for mb in sampler:
                mask = None if mask_all is None else mb["valid"]
                adv = mb["advantage"]
                if c.norm_adv and not normalize_once:
                    adv = normalize_advantage(adv, mask)
                loss_args: LossArgs = (
                    mb["sample_log_prob"],
                    adv,
                    mb["value"],
                    mb["return"],
                    mask,
                    c.clip_coef,
                    c.vf_clip_coef,
                    c.vf_coef,
                    c.ent_coef,
                )
                outputs, entropy = self.step(mb, loss_args, track, need_entropy=track or c.ent_coef > 0)
                epoch_steps += 1
                if track:  # then the step gave the loss outputs and the entropy
                    _, ratio, pg_loss, v_loss = cast(LossOutputs, outputs)
                    with torch.no_grad():
                        approx_kl, clipfrac = policy_stats(ratio, c.clip_coef, mask)
                        ent = masked_mean(cast(torch.Tensor, entropy), mask)
                        totals += torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac])
            sgd_steps += epoch_steps
            if c.target_kl is not None and totals[3].item() / epoch_steps > c.target_kl:
                break  # early stop: the policy moved too far from the one that collected the data

        stats = dict(zip(STAT_NAMES, (totals / epoch_steps).tolist()))
        value, returns = data["value"], data["return"]
        if mask_all is not None:
            value, returns = value[mask_all], returns[mask_all]
        stats["explained_variance"] = explained_variance(value, returns)
        stats["num_sgd_epochs"] = epochs
        stats["num_sgd_steps"] = sgd_steps
        return stats


class AutogradPPOStep:
    """One PPO minibatch step on autograd: any model, hooks and all (``torch.optim.Adam``)."""

    def __init__(self, policy: ActorCriticPolicy, lr: float, eps: float, max_grad_norm: float | None):
        self.policy, self.max_grad_norm = policy, max_grad_norm
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=eps, fused=True)

    @property
    def lr(self) -> float:
        lr: float = self.optimizer.param_groups[0]["lr"]
        return lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.param_groups[0]["lr"] = value

    def __call__(
        self, mb: TensorDict, loss_args: LossArgs, track: bool, need_entropy: bool
    ) -> tuple[LossOutputs, torch.Tensor | None]:
        """``(loss, ratio, pg_loss, v_loss)`` and the entropy."""
        logp, entropy, value = self.policy.evaluate(
            mb["obs"],
            mb["action"],
            entropy=need_entropy,
            action_mask=mb.get("action_mask", None),
            critic_obs=mb.get("critic_obs", None),
        )
        outputs = ppo_loss(logp, value, entropy, *loss_args)
        self.optimizer.zero_grad()
        outputs[0].backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        return outputs, None if entropy is None else entropy.detach()

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
