"""``Policy``, the contract the collector, evaluation and ``compute_actions`` act through, and
``ActorCriticPolicy``, the policy every on-policy algorithm in shoal uses by default."""

from __future__ import annotations

from typing import cast

import torch
from tensordict import TensorDict
from torch import nn

from shoal.envs.spaces import ActionSpec
from shoal.models.distributions import DiagGaussian, make_distribution
from shoal.models.normalize import ObsNormalizer

# raised rather than ignoring the mask: a caller passing one expects it to constrain the actions
BOX_MASK_ERROR = "action_mask is only supported for Discrete and MultiDiscrete actions, not continuous (Box)"


class Policy(nn.Module):
    """Base of every policy: subclasses implement ``act`` and set ``extras``.

    The collector, evaluation and ``compute_actions`` act through two methods:

        act(obs, state, first, action_mask) -> (action, extras, next_state)
        initial_state(rows) -> state

    ``state`` is a TensorDict with one entry per agent row: empty for feedforward models, the
    recurrent core's tensors otherwise; a recurrent policy resets the rows where ``first`` is True
    (the observation starts an episode) before using them. A gSDE policy's state is its rows' noise
    matrices, which it keeps across episode starts and redraws per collection (``sde``). ``extras``
    is a TensorDict of what the algorithm asked the collector to store per step (for PPO:
    ``sample_log_prob`` and ``value``).
    When the caller passes ``out`` (a TensorDict of views into the rollout), the policy writes the
    extras ``out`` holds there (all of its ``extras``, or the subset the algorithm stores) and
    returns it, so the rollout loop creates nothing per step.
    """

    extras: tuple[str, ...] = ()
    """The per-step fields ``act`` fills (e.g. ``sample_log_prob``, ``value``)."""
    policy_id: str = ""
    """The id the algorithm built this policy under (errors about it name it)."""
    synced_attributes: tuple[str, ...] = ()
    """Plain attributes that acting reads and the algorithm changes during training (DQN's
    ``epsilon``): copies of the policy acting in other processes (Ray rollout workers) receive
    them with the weights, which the state dict carries."""
    obs_normalizer: ObsNormalizer | None
    """Running statistics that normalize observations before the model sees them (None: raw)."""
    critic_normalizer: ObsNormalizer | None
    """The same for a centralized critic's input."""

    def __init__(self) -> None:
        super().__init__()
        self.obs_normalizer = self.critic_normalizer = None

    def normalize(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's inputs: ``(obs, critic_obs)`` normalized when the policy keeps statistics."""
        if self.obs_normalizer is not None:
            obs = self.obs_normalizer.normalize(obs)
        if critic_obs is not None and self.critic_normalizer is not None:
            critic_obs = self.critic_normalizer.normalize(critic_obs)
        return obs, critic_obs

    @torch.no_grad()
    def update_obs_stats(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> None:
        """Fold a batch of raw observations into the normalization statistics (a no-op without them);
        data-parallel ranks fold in all of theirs, so their policies stay equal."""
        if self.obs_normalizer is not None:
            self.obs_normalizer.stats.update(obs, across_ranks=True)
        if critic_obs is not None and self.critic_normalizer is not None:
            self.critic_normalizer.stats.update(critic_obs, across_ranks=True)

    def start_collection(self) -> None:
        """Called before each collection the algorithm starts (a rollout, a replay phase): a policy
        whose exploration is held across steps (gSDE) draws anew. Does nothing by default."""

    def initial_state(self, rows: int) -> TensorDict:
        """The state of ``rows`` agent rows at an episode start (empty: feedforward)."""
        return TensorDict({}, batch_size=[rows])

    def act(
        self,
        obs: torch.Tensor,
        state: TensorDict,
        first: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        deterministic: bool = False,
        out: TensorDict | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TensorDict, TensorDict]:
        """``(action, extras, next_state)`` for a batch of rows, as the class docstring describes:
        the most likely actions with ``deterministic``, the extras written into ``out`` when given,
        and ``critic_obs`` the centralized critic's input where the policy has one."""
        raise NotImplementedError

    def value(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """Values ``[B]`` of raw observations, which on-policy learners bootstrap truncated episodes
        with; ``state`` is read by recurrent policies only. A policy without one cannot learn on-policy."""
        raise NotImplementedError(f"{type(self).__name__} has no value(obs, critic_obs, state)")


class ActorCriticPolicy(Policy):
    """Actions sampled from a distribution whose inputs, with a value, come from ``model``
    (``obs -> (dist_inputs [B, P], value [B])``). Box actions add a state-independent ``log_std``.

    ``act`` is the rollout path; ``evaluate`` the learning path (log-prob and entropy of stored
    actions, and values), which must be given the action mask the action was sampled under.

    Observation normalization happens here, in one place: the rollout stores raw observations
    (uint8 images stay uint8), and every forward (acting, learning, evaluation,
    ``compute_actions``) normalizes with the running statistics the algorithm updates from each
    batch it collects.
    """

    extras = ("sample_log_prob", "value")

    def __init__(
        self,
        model: nn.Module,
        action: ActionSpec,
        obs_normalizer: ObsNormalizer | None = None,
        critic_normalizer: ObsNormalizer | None = None,
        log_std_init: float = 0.0,
    ):
        super().__init__()
        self.model = model
        self.dist = make_distribution(action)
        self.continuous = action.kind == "continuous"
        self.obs_normalizer, self.critic_normalizer = obs_normalizer, critic_normalizer
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((self.dist.param_dim,), float(log_std_init)))

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs ``[B, P]`` and values ``[B]`` of raw observations."""
        obs, critic_obs = self.normalize(obs, critic_obs)
        out: tuple[torch.Tensor, torch.Tensor] = self.model(obs) if critic_obs is None else self.model(obs, critic_obs)
        return out

    def value(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None, state: TensorDict | None = None
    ) -> torch.Tensor:
        """Values ``[B]`` of raw observations (e.g. to bootstrap a truncated episode); ``state`` is
        read by recurrent policies only."""
        return self.forward(obs, critic_obs)[1]

    def act(
        self,
        obs: torch.Tensor,
        state: TensorDict,
        first: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        deterministic: bool = False,
        out: TensorDict | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TensorDict, TensorDict]:
        """Sample actions (the most likely with ``deterministic``) within ``action_mask``; the extras
        are ``sample_log_prob`` and ``value``, written into ``out`` when given. Feedforward: the
        state passes through unchanged."""
        params, value = self.forward(obs, critic_obs)
        action, logp = self.sample(params, action_mask, deterministic)
        return action, self.write_extras(logp, value, out), state

    def sample(
        self, params: torch.Tensor, action_mask: torch.Tensor | None, deterministic: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions drawn from the distribution ``params`` describe (the most likely with
        ``deterministic``), and their log-probabilities."""
        dist = self.dist
        if isinstance(dist, DiagGaussian):  # continuous
            if action_mask is not None:
                raise ValueError(BOX_MASK_ERROR)
            return dist.sample(params, self.log_std, deterministic)
        return dist.sample(params, deterministic, action_mask)

    def write_extras(self, logp: torch.Tensor, value: torch.Tensor, out: TensorDict | None) -> TensorDict:
        """The per-step extras, written into ``out`` (the subset the algorithm stores) when given."""
        extras = {"sample_log_prob": logp, "value": value}
        if out is None:
            return TensorDict(extras, batch_size=logp.shape[:1])
        for key, stored in out.items():  # the extras the algorithm stores: all of these, or some
            cast(torch.Tensor, stored).copy_(extras[key])  # flat: one tensor per extra
        return out

    def score(
        self, params: torch.Tensor, action: torch.Tensor, entropy: bool, action_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probability of ``action`` under ``params`` and the entropy (None when not asked for)."""
        dist = self.dist
        if isinstance(dist, DiagGaussian):  # continuous
            if action_mask is not None:
                raise ValueError(BOX_MASK_ERROR)
            return dist.log_prob_entropy(params, self.log_std, action, entropy)
        return dist.log_prob_entropy(params, action, entropy, action_mask)

    def evaluate(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        entropy: bool = True,
        action_mask: torch.Tensor | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probability of ``action`` under the current policy, its entropy (None when not
        asked for) and values."""
        params, value = self.forward(obs, critic_obs)
        logp, ent = self.score(params, action, entropy, action_mask)
        return logp, ent, value
