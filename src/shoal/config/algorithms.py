"""The on-policy algorithms' configs: the keys of the family (``OnPolicyConfig``), those PPO and GRPO share
(``SurrogateConfig``), and each one's own."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, cast

from pydantic import Field, model_validator

from shoal.config.base import nearest
from shoal.config.exploration import EpsilonGreedyConfig
from shoal.config.layout import BatchLayout
from shoal.config.sde import StateDependentExplorationConfig
from shoal.config.trainer import TrainerConfig
from shoal.envs.horizon import declared_episode_steps
from shoal.errors import ConfigError, did_you_mean, shorten
from shoal.imports import import_spec, is_spec


class OnPolicyConfig(TrainerConfig):
    """Keys of the on-policy algorithms, which learn from each iteration's rollout in epochs of minibatch steps
    (PPO, the segment learner, GRPO, and on-policy algorithms of your own)."""

    num_sgd_iter: int = Field(default=20, ge=1)
    """Epochs of minibatch steps over each iteration's batch (also written `update_epochs`)."""
    ent_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the entropy bonus."""
    target_kl: float | None = Field(default=None, gt=0.0)
    """Stop an update's epochs early once an epoch's mean approximate KL exceeds this; None: run all `num_sgd_iter`
    epochs."""

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (
        *TrainerConfig.POLICY_KEYS,
        "adam_eps",
        "ent_coef",
        "max_grad_norm",
        "target_kl",
        "num_sgd_iter",
        "sgd_minibatch_size",
    )
    ALIASES: ClassVar[dict[str, str]] = {**TrainerConfig.ALIASES, "update_epochs": "num_sgd_iter"}


class SurrogateConfig(OnPolicyConfig):
    """Keys of the algorithms that learn with PPO's clipped surrogate objective (PPO and GRPO share them)."""

    clip_coef: float = Field(default=0.2, gt=0.0)
    """Clip range of the policy ratio in the surrogate objective: `[1 - clip_coef, 1 + clip_coef]`."""

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OnPolicyConfig.POLICY_KEYS, "clip_coef")
    MINIBATCH_DIVIDES_BATCH: ClassVar[bool] = True


class PPOConfig(SurrogateConfig, StateDependentExplorationConfig):
    """PPO's keys (and those it shares with GRPO, `SurrogateConfig`). Defaults solve CartPole-v1 in well under 100k
    steps (rl-baselines3-zoo's CartPole settings)."""

    advantage_estimator: str = "gae"
    """The advantage function: `gae`, `vtrace` (V-trace-adjusted GAE, recomputed for each minibatch with the current
    policy's importance ratios), or `'package.module:function'` taking `(rollout, gamma, gae_lambda)` and returning
    advantages `[N, T]`."""
    vtrace_rho_clip: float = Field(default=1.0, gt=0.0)
    """V-trace's clip of the importance ratio that weighs each TD error (rho-bar)."""
    vtrace_c_clip: float = Field(default=1.0, gt=0.0)
    """V-trace's clip of the importance ratio that carries the trace on (c-bar)."""
    fused_update: bool = True
    """Learn with the hand-fused step when the policy is the plain built-in MLP (the same numbers, faster); False:
    always autograd."""
    bptt_horizon: int | None = Field(default=None, ge=1)
    """Steps per training segment: the learner views the rollout as `[segments, bptt_horizon]` and a recurrent model
    backpropagates through each segment from its stored start state. Must divide `rollout_fragment_length` and
    `sgd_minibatch_size`; None: the whole fragment for a recurrent model, single steps otherwise."""
    accumulate_minibatches: int = Field(default=1, ge=1)
    """Minibatches whose gradients add up to one optimizer step (the same step as one minibatch that many times as
    large); must divide the number of minibatches."""
    prio_alpha: float = Field(default=0.0, ge=0.0)
    """Prioritized minibatches: segments are drawn with probability proportional to (sum of their absolute
    advantages) ** prio_alpha, with importance weights; 0: every segment once per epoch, uniformly shuffled."""
    prio_beta0: float = Field(default=0.6, ge=0.0, le=1.0)
    """The importance-weight exponent of prioritized minibatches at the start of `learn()`; it rises linearly to 1
    by the end."""
    gae_lambda: float = Field(default=0.8, ge=0.0, le=1.0)
    """GAE's lambda: 0 gives one-step TD errors, 1 Monte Carlo returns minus the value."""
    vf_clip_coef: float | None = Field(default=None, gt=0.0)
    """Clip new values to within this distance of the values at collection time in the value loss; None: no value
    clipping."""
    vf_coef: float = Field(default=1.0, ge=0.0)
    """Weight of the value loss, 0.5 x squared error (so 1.0 weighs it as SB3's `vf_coef=0.5` on plain MSE)."""
    norm_adv: bool = True
    """Normalize advantages to mean 0 and std 1 within each minibatch."""

    NOTES: ClassVar[dict[str, str]] = {
        "sgd_minibatch_size": "PPO: it must divide the agent steps of an iteration (with several policies, each "
        "policy's steps are split into near-equal minibatches of about this size)."
    }

    POLICY_KEYS: ClassVar[tuple[str, ...]] = (
        *SurrogateConfig.POLICY_KEYS,
        "gae_lambda",
        "vf_clip_coef",
        "vf_coef",
        "norm_adv",
    )

    @model_validator(mode="after")
    def _check_estimator(self) -> PPOConfig:
        from shoal.algos.on_policy import ESTIMATORS  # here: shoal.algos imports this module

        spec = self.advantage_estimator
        if spec not in ESTIMATORS:
            if not is_spec(spec):
                raise ConfigError(
                    f"advantage_estimator={shorten(repr(spec))} is not one of {list(ESTIMATORS)} nor a "
                    f"'package.module:function'.{did_you_mean(spec, ESTIMATORS)}"
                )
            import_spec(spec, "advantage_estimator")
        return self

    @model_validator(mode="after")
    def _check_batch_mode(self) -> PPOConfig:
        # accumulated minibatches alone are segments of one step, which rows of any length hold
        cut = self.recurrent or self.advantage_estimator == "vtrace" or self.bptt_horizon not in (None, 1)
        if self.batch_mode == "complete_episodes" and (cut or self.prio_alpha > 0):
            raise ConfigError(
                f"batch_mode='complete_episodes' gives rows of varying length, and the segment learner (asked for "
                f"by {self.learns_from_segments}) cuts each row into equal segments; use "
                f"batch_mode='truncate_episodes' with it."
            )
        return self

    @property
    def learns_from_segments(self) -> str | None:
        """What in this config makes PPO learn from ``[segments, bptt_horizon]`` views of the rollout
        (the segment learner) instead of single transitions; None: nothing does (``bptt_horizon``
        alone does not: a feedforward model with GAE learns from shuffled transitions)."""
        reasons = {
            "a recurrent model_config core": self.recurrent,
            "advantage_estimator='vtrace'": self.advantage_estimator == "vtrace",
            f"prio_alpha={self.prio_alpha}": self.prio_alpha > 0,
            f"accumulate_minibatches={self.accumulate_minibatches}": self.accumulate_minibatches > 1,
        }
        return next((reason for reason, applies in reasons.items() if applies), None)

    @property
    def segment_length(self) -> int:
        """``bptt_horizon``, or its default: the whole fragment for a recurrent model or V-trace
        (which runs its traces along segments), else 1."""
        if self.bptt_horizon is not None:
            return self.bptt_horizon
        whole = self.recurrent or self.advantage_estimator == "vtrace"
        return cast(int, self.rollout_fragment_length) if whole else 1  # filled when validated

    def layout(self, agents_per_env: int = 1) -> BatchLayout:
        """What the batch keys add up to with ``agents_per_env`` agents in each env."""
        return BatchLayout(
            self.num_envs,
            agents_per_env,
            self.async_factor,
            self.num_workers,
            cast(int, self.rollout_fragment_length),  # filled when validated
            self.sgd_minibatch_size,
            self.segment_length,
            self.accumulate_minibatches,
            self.num_sgd_iter,
        )

    def check_batch(self, agents_per_env: int = 1) -> None:
        """The learner sees ``batch_size`` agent steps per iteration (``train_batch_size x
        agents_per_env``); checked once the env's agent count is known: the minibatches divide it,
        segments fit in each row's fragment and in each minibatch, and the accumulated minibatches
        divide an epoch."""
        super().check_batch(agents_per_env)
        layout = self.layout(agents_per_env)
        frag, bptt = layout.rollout_fragment_length, layout.bptt_horizon
        if frag % bptt:
            fits = [d for d in range(1, frag + 1) if frag % d == 0]
            raise ConfigError(
                f"bptt_horizon={bptt} must divide rollout_fragment_length={frag}: each row's fragment is cut "
                f"into segments of bptt_horizon steps. Try bptt_horizon={nearest(fits, bptt)}."
            )
        batch, mb = layout.agent_steps, self.sgd_minibatch_size
        if mb % bptt:
            raise ConfigError(
                f"sgd_minibatch_size={mb} must be a multiple of bptt_horizon={bptt}: a minibatch is whole "
                f"segments. Try sgd_minibatch_size={nearest([mb // bptt * bptt or bptt, -(-mb // bptt) * bptt], mb)}."
            )
        if (self.policies and len(self.policies) > 1) or self.batch_mode == "complete_episodes":
            return  # a batch of varying size (a policy's share, whole episodes) is split into near-equal minibatches
        if mb > batch or batch % mb:
            near = nearest([d for d in range(bptt, batch + 1, bptt) if batch % d == 0], mb)
            agents = f" x {agents_per_env} agents" if agents_per_env > 1 else ""
            raise ConfigError(
                f"sgd_minibatch_size={mb} must divide the {batch} agent steps of an iteration "
                f"(train_batch_size={self.train_batch_size} = num_envs={self.num_envs} x rollout_fragment_length="
                f"{self.rollout_fragment_length}{agents}). Try sgd_minibatch_size={near}."
            )
        if layout.num_minibatches % self.accumulate_minibatches:
            fits = [d for d in range(1, layout.num_minibatches + 1) if layout.num_minibatches % d == 0]
            near = nearest(fits, self.accumulate_minibatches)
            raise ConfigError(
                f"accumulate_minibatches={self.accumulate_minibatches} must divide the {layout.num_minibatches} "
                f"minibatches of an epoch ({batch} agent steps / sgd_minibatch_size={mb}). "
                f"Try accumulate_minibatches={near}."
            )


class GRPOConfig(SurrogateConfig):
    """GRPO's keys (and those it shares with PPO, `SurrogateConfig`). Group Relative Policy Optimization has no
    critic: each iteration resets `num_envs / group_size` groups of `group_size` envs, each group from one seed, and
    every step of an env's first episode gets that episode's return normalized within its group. Defaults (8 envs in
    one group) solve CartPole-v1 within 300k steps (benchmarks/grpo_cartpole.py)."""

    NO_RESTARTS = "a restart would cut an episode short, which GRPO would score against its group as a finished one"

    group_size: int = Field(default=8, ge=2)
    """Episodes per group, G: the envs of a group reset with the same seed, and each episode's return is compared
    with the others' of its group. `num_envs` must be a multiple of it."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the KL penalty `KL(pi || pi_ref)` to a frozen reference policy (the k3 estimator on the sampled
    actions); 0: no penalty, and no reference copy is kept."""
    ref_update_interval: int | None = Field(default=None, ge=1)
    """With `kl_coef`: iterations between refreshes of the reference policy (a copy of the policy); None: it stays
    the policy training started from."""
    adv_eps: float = Field(default=1e-4, gt=0.0)
    """Added to the group's return std: the advantage is `(R - mean) / (std + adv_eps)` (0 for a group whose
    episodes all return the same)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"sgd_minibatch_size": 512, "num_sgd_iter": 4}
    NOTES: ClassVar[dict[str, str]] = {
        "sgd_minibatch_size": "GRPO: an iteration's first-episode steps, whose number varies, are split into "
        "near-equal minibatches of about this size.",
        "num_sgd_iter": "GRPO: the batch is the iteration's first-episode steps.",
        "rollout_fragment_length": "GRPO: the most steps per env per iteration, as an iteration ends as soon as "
        "every env's first episode has ended; None: the env's `max_episode_steps` when it declares one (its "
        "Gymnasium spec, or `env_config`), else 500, or `horizon` when that is shorter. An episode still running at "
        "the end counts with the return it reached.",
    }

    @model_validator(mode="after")
    def _check_groups(self) -> GRPOConfig:
        n, g = self.num_envs, self.group_size
        if n % g:
            lo = n // g * g
            envs = f"{lo} or {lo + g}" if lo else f"{g}"
            sizes = [d for d in range(2, n + 1) if n % d == 0]
            other = f", or group_size={nearest(sizes, g)}" if sizes else ""
            raise ConfigError(
                f"num_envs={n} must be a multiple of group_size={g}: the envs form num_envs / group_size groups "
                f"of group_size episodes. Try num_envs={envs}{other}."
            )
        if self.normalize_reward:
            raise ConfigError(
                "normalize_reward=true has no use with GRPO, which normalizes each group's returns itself; "
                "leave it false."
            )
        if self.batch_mode == "complete_episodes":
            raise ConfigError(
                "batch_mode='complete_episodes' has no use with GRPO, which learns from each env's first episode "
                "of every iteration already; leave batch_mode='truncate_episodes'."
            )
        if self.soft_horizon:
            raise ConfigError(
                "soft_horizon=True has no use with GRPO, which resets every env from its group's seed each "
                "iteration and learns from first episodes only; use horizon=H alone."
            )
        return self

    def _fill_rollout_shape(self) -> None:
        if self.rollout_fragment_length is None and self.train_batch_size is None:
            declared = declared_episode_steps(self.env, self.env_config) or 500
            self.rollout_fragment_length = min(declared, self.horizon or declared)
        super()._fill_rollout_shape()


class PQNConfig(OnPolicyConfig, EpsilonGreedyConfig):
    """PQN's keys (and the exploration keys of `EpsilonGreedyConfig`). Parallel Q-learning learns a Q-network on
    each iteration's rollout of many envs, as PPO learns its policy: Q(lambda) returns, then epochs of shuffled
    minibatches, with no replay buffer and no target network. Defaults are PQN's published CartPole-v1 settings
    (purejaxql `pqn_cartpole.yaml`): 32 envs x 64 steps, 4 epochs of 16 minibatches, RAdam at 1e-4 decaying
    linearly, epsilon from 1 to 0.2 over the first 20%, rewards x 0.1, and a 2 x 256 ReLU Q-network with
    LayerNorm."""

    q_lambda: float = Field(default=0.95, ge=0.0, le=1.0)
    """The trace decay of the Q(lambda) returns: 0 gives one-step Q-learning targets, 1 Monte Carlo returns."""
    reward_scale: float = Field(default=0.1, gt=0.0)
    """Rewards are multiplied by this in the returns the Q-network learns (its values are in the scaled units)."""
    optimizer: Literal["adam", "radam"] = "radam"
    """`radam`: rectified Adam (Liu et al. 2020), as PQN learns; `adam`: plain Adam."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_envs": 32,
        "rollout_fragment_length": 64,
        "num_sgd_iter": 4,
        "sgd_minibatch_size": 128,
        "learning_rate": 1e-4,
        "max_grad_norm": 10.0,
        "adam_eps": 1e-8,
        "gamma": 0.99,
        "exploration_fraction": 0.2,
        "exploration_final_eps": 0.2,
        "total_timesteps": 500_000,
    }
    NOTES: ClassVar[dict[str, str]] = {
        "sgd_minibatch_size": "PQN: each epoch's transitions are split into near-equal minibatches of about this size.",
        "ent_coef": "PQN: unused (its policy is epsilon-greedy).",
        "target_kl": "PQN: must stay unset (it records no KL).",
    }
    POLICY_KEYS: ClassVar[tuple[str, ...]] = (*OnPolicyConfig.POLICY_KEYS, "q_lambda")
