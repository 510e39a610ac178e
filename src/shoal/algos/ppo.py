"""PPO's update step, top to bottom (Schulman et al. 2017, arXiv:1707.06347).

The implementation details follow "The 37 Implementation Details of PPO" (Huang et al. 2022):
orthogonal init lives in the model; learning-rate annealing is the ``learning_rate`` argument the
trainer passes each iteration; GAE, shuffled minibatches, advantage normalization, Adam with its
eps, global gradient clipping and the approx_kl / clipfrac / explained_variance diagnostics are
here; the clipped surrogate, optional value clipping and the entropy bonus are ``ppo_loss``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from shoal.algos.advantages import gae
from shoal.algos.losses import (explained_variance, masked_mean, normalize_advantage, policy_stats, ppo_loss,
                                ppo_loss_and_grad)
from shoal.buffers.rollout import iterate_minibatches, num_minibatches, transition_view
from shoal.config import PPOConfig
from shoal.models.flat import FlatAdam, flatten_parameters
from shoal.models.policy import ActorCritic

STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac")
LEARN_KEYS = ("obs", "action", "sample_log_prob", "value", "return", "advantage", "valid")


class PPOLearner:
    """``use_autograd`` forces the autograd engine; by default it is used only for policies without
    an engine-free ``evaluate_backward`` (the same gradients, a third of the time on small nets)."""

    def __init__(self, policy: ActorCritic, config: PPOConfig, generator: torch.Generator | None = None,
                 use_autograd: bool = False):
        self.policy, self.config, self.generator = policy, config, generator
        self.optimizer = FlatAdam(flatten_parameters(policy), lr=config.learning_rate, eps=config.adam_eps)
        self.use_autograd = use_autograd or not hasattr(policy, "evaluate_backward")

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(),
                "generator": None if self.generator is None else self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    def update(self, rollout: TensorDict, learning_rate: float, select: torch.Tensor | None = None) -> dict[str, float]:
        """One PPO update on a full ``[N, T+1]`` rollout, or on its transitions ``select`` (bool,
        flat ``[N*T]``: the steps this learner's policy took); returns loss statistics.

        Advantages are computed over whole rows either way: a row changes policy only between
        episodes, where GAE does not bootstrap."""
        c = self.config
        self.optimizer.lr = learning_rate

        # 1. Advantages and returns on the whole rollout. Padding / next-step reset rows exist only
        #    with some backends; skip the masking cost otherwise.
        valid = rollout["valid"][:, :-1]
        all_valid = bool(valid.all())
        with torch.no_grad():
            value = rollout["value"]
            advantage = gae(rollout["reward"][:, :-1], value, rollout["terminated"][:, :-1],
                            rollout["truncated"][:, :-1], rollout["final_value"][:, :-1], c.gamma, c.gae_lambda,
                            valid_t=None if all_valid else valid)
            rollout["advantage"][:, :-1] = advantage
            rollout["return"][:, :-1] = advantage + value[:, :-1]
        keys = (*LEARN_KEYS, *(key for key in ("action_mask", "critic_obs") if key in rollout.keys()))
        data = transition_view(rollout.select(*keys), flatten=True)
        if select is not None:
            data = data[select]
        mask_all = None if all_valid else data["valid"]
        # One minibatch per epoch sees the same rows every epoch: normalize their advantages once.
        normalize_once = c.norm_adv and num_minibatches(data.batch_size[0], c.sgd_minibatch_size) == 1
        if normalize_once:
            data["advantage"] = normalize_advantage(data["advantage"], mask_all)

        # 2. Epochs of shuffled minibatches. Diagnostics are kept for the last epoch (and for
        #    every epoch when target_kl needs them): they cost a dozen ops per minibatch.
        totals = torch.zeros(len(STAT_NAMES))
        sgd_steps = epochs = 0
        for epochs in range(1, c.num_sgd_iter + 1):
            track = c.target_kl is not None or epochs == c.num_sgd_iter
            totals.zero_()
            epoch_steps = 0
            for mb in iterate_minibatches(data, c.sgd_minibatch_size, self.generator):
                mask = None if mask_all is None else mb["valid"]
                action_mask = mb.get("action_mask", None)  # Discrete / MultiDiscrete envs that provide one
                critic_obs = mb.get("critic_obs", None)  # a centralized critic's input
                need_entropy = track or c.ent_coef > 0
                adv = mb["advantage"]
                if c.norm_adv and not normalize_once:
                    adv = normalize_advantage(adv, mask)
                loss_args = (mb["sample_log_prob"], adv, mb["value"], mb["return"], mask, c.clip_coef,
                             c.vf_clip_coef, c.vf_coef, c.ent_coef)
                if self.use_autograd:
                    logp, entropy, new_value = self.policy.evaluate(mb["obs"], mb["action"], entropy=need_entropy,
                                                                    action_mask=action_mask, critic_obs=critic_obs)
                    loss, ratio, pg_loss, v_loss = ppo_loss(logp, new_value, entropy, *loss_args)
                    self.optimizer.zero_grad()
                    loss.backward()
                else:
                    outputs, entropy = self.policy.evaluate_backward(
                        mb["obs"], mb["action"],
                        lambda logp, ent, value: ppo_loss_and_grad(logp, value, ent, *loss_args, with_values=track),
                        entropy=need_entropy, action_mask=action_mask, critic_obs=critic_obs)
                    if track:
                        _, ratio, pg_loss, v_loss = outputs
                if c.max_grad_norm is not None:
                    self.optimizer.clip_grad_norm_(c.max_grad_norm)
                self.optimizer.step()

                epoch_steps += 1
                if track:
                    with torch.no_grad():
                        approx_kl, clipfrac = policy_stats(ratio, c.clip_coef, mask)
                        totals += torch.stack([pg_loss, v_loss, masked_mean(entropy, mask), approx_kl, clipfrac])
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
