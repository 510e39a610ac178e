"""Actors and critics learned from replay (SAC, TD3, MADDPG).

Inside the networks Box actions are "unit" actions in ``[-1, 1]`` (a tanh keeps them there); they
are rescaled to the Box bounds where they leave the policy, and the learner maps stored actions
back (``to_unit``). So one network, and one noise scale, fits any bounds. Discrete actions (MADDPG)
reach the critics as one-hots. The critics are ``k`` Q-networks over the observation and the
action, run side by side as one batched matmul per layer (``QTowers``). Every network here keeps
torch's default layer init, which these learners are tuned with (the orthogonal init of the
policy-gradient models is not).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, TypeVar, cast

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from shoal.envs.spaces import ActionSpec, EnvInfo
from shoal.errors import ConfigError
from shoal.models.catalog import obs_normalizers
from shoal.models.distributions import DiagGaussian
from shoal.models.layers import ACTIVATION_MODULES, StackedMLP
from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import Policy
from shoal.models.sde import HeldNoise, StateDependentNoise, sde_log_scale, sde_noise

if TYPE_CHECKING:  # shoal.config imports the catalog, which this module imports
    from shoal.config import TrainerConfig

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # keeps the Gaussian's std within what float32 can sample
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def default_init_(module: ModuleT) -> ModuleT:
    """Re-initialize ``module``'s layers as torch initializes ``nn.Linear``: uniform within
    ``1 / sqrt(fan_in)`` (stacked towers too, whose weights are stored ``[k, in, out]``)."""
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            layer.reset_parameters()
        elif isinstance(layer, StackedMLP):
            with torch.no_grad():
                for weight, bias in zip(layer.weights, layer.biases):
                    bound = 1.0 / math.sqrt(weight.shape[1])
                    weight.uniform_(-bound, bound)
                    bias.uniform_(-bound, bound)
    return module


def feedforward(in_dim: int, hiddens: list[int], out_dim: int, activation: str) -> nn.Sequential:
    """An MLP ``in_dim -> hiddens -> out_dim`` with torch's default init."""
    return nn.Sequential(*hidden_layers(in_dim, hiddens, activation), nn.Linear([in_dim, *hiddens][-1], out_dim))


def hidden_layers(in_dim: int, hiddens: list[int], activation: str) -> nn.Sequential:
    """The hidden layers ``in_dim -> hiddens``, each followed by its activation, with torch's default init."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise([in_dim, *hiddens]):
        layers += [nn.Linear(fan_in, fan_out), ACTIVATION_MODULES[activation]()]
    return nn.Sequential(*layers)


class QTowers(nn.Module):
    """``towers`` independent Q-networks over the same input ``[B, in_dim]`` (observation and
    action side by side); returns ``[towers, B]``."""

    def __init__(self, in_dim: int, hiddens: list[int], towers: int = 2, activation: str = "relu"):
        super().__init__()
        self.net = default_init_(StackedMLP(in_dim, hiddens, [1] * towers, [1.0] * towers, activation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.stacked(x).squeeze(-1)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        """The first network's values ``[B]`` alone (``forward(x)[0]`` at 1/towers of the work)."""
        return self.net.tower(x, 0).squeeze(-1)


class ReplayActorPolicy(Policy):
    """A policy acting by an ``actor`` network over ``features(obs)``: the raw observations
    normalized (when the policy keeps statistics) and flattened to float32, which the critics
    read too. Before ``learning_starts`` the algorithm sets ``random_actions``. Subclasses say how
    the actor's output becomes an action, and how critics read stored actions (``critic_input``);
    MADDPG's actors also give their own actions as critics read them (``critic_action``)."""

    synced_attributes = ("random_actions",)

    def __init__(self, actor: nn.Module, obs_normalizer: ObsNormalizer | None):
        super().__init__()
        self.actor, self.obs_normalizer = actor, obs_normalizer
        self.random_actions = False
        """Act uniformly at random (unless ``deterministic``): the algorithm sets it while the buffer
        fills, before ``learning_starts``."""

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's (and the critics') input from raw observations ``[B, ...]``: ``[B, obs_dim]``."""
        return self.normalize(obs)[0].flatten(1).float()

    def random_action(self, rows: int, device: torch.device) -> torch.Tensor:
        """Uniformly random actions for ``rows`` rows."""
        raise NotImplementedError

    def policy_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions for the features ``x``, exploring unless ``deterministic``."""
        raise NotImplementedError

    def critic_input(self, action: torch.Tensor) -> torch.Tensor:
        """Stored actions as the critics read them."""
        raise NotImplementedError

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
        """Actions (exploring unless ``deterministic``); no extras, and the state passes through."""
        if action_mask is not None:
            raise ValueError(f"{type(self).__name__} does not take action masks")
        if self.random_actions and not deterministic:
            action = self.random_action(len(obs), obs.device)
        else:
            action = self.policy_action(self.features(obs), deterministic)
        return action, out if out is not None else TensorDict({}, batch_size=[len(obs)]), state


class BoundedActorPolicy(ReplayActorPolicy):
    """A policy whose ``actor`` network acts in unit actions, rescaled to the Box bounds."""

    center: torch.Tensor
    half_range: torch.Tensor

    def __init__(self, actor: nn.Module, action: ActionSpec, obs_normalizer: ObsNormalizer | None = None):
        super().__init__(actor, obs_normalizer)
        space = cast(gym.spaces.Box, action.space)
        low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ConfigError(
                f"the Box action space {action.space} has infinite bounds; SAC, TD3 and MADDPG squash actions into "
                f"the bounds, so they need finite ones (wrap the env to rescale its actions, or use algo=ppo)."
            )
        if (high <= low).any():
            raise ConfigError(
                f"the Box action space {action.space} has no room on dimensions "
                f"{np.flatnonzero(high <= low).tolist()} (high <= low); drop them from the action space."
            )
        self.register_buffer("center", torch.as_tensor((high + low) / 2))
        self.register_buffer("half_range", torch.as_tensor((high - low) / 2))

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """Unit actions ``[-1, 1]`` rescaled to the Box bounds."""
        return torch.addcmul(self.center, unit, self.half_range)

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """Actions in the Box bounds mapped to ``[-1, 1]`` (the inverse of ``to_env``)."""
        return ((action - self.center) / self.half_range).clamp_(-1.0, 1.0)

    def unit_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Unit actions for the features ``x``, exploring unless ``deterministic``."""
        raise NotImplementedError

    def random_action(self, rows: int, device: torch.device) -> torch.Tensor:
        return self.to_env(torch.rand(rows, *self.center.shape, device=device).mul_(2.0).sub_(1.0))

    def policy_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return self.to_env(self.unit_action(x, deterministic))

    def critic_input(self, action: torch.Tensor) -> torch.Tensor:
        return self.to_unit(action)


class SquashedGaussianPolicy(BoundedActorPolicy):
    """SAC's actor: a Gaussian whose mean and log-std come from the actor network, squashed
    by tanh into unit actions; deterministic acting takes tanh of the mean."""

    def sample(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized unit actions ``[B, d]`` for the features ``x`` and their log-probabilities
        ``[B]``, with the tanh's change of volume: ``log N(u) - sum log(1 - tanh(u)^2)``."""
        mean, log_std = self.actor(x).chunk(2, -1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        noise = torch.randn_like(mean)
        pre_tanh = mean + log_std.exp() * noise
        log_prob = -(0.5 * noise.square() + log_std + LOG_SQRT_2PI).sum(-1)
        return squashed(pre_tanh, log_prob)

    def unit_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return torch.tanh(self.actor(x).chunk(2, -1)[0])
        return self.sample(x)[0]


def squashed(pre_tanh: torch.Tensor, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tanh(pre_tanh)`` and the log-probability ``log_prob`` of ``pre_tanh`` moved through it."""
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), exact without tanh's rounding near +-1
    log_prob = log_prob - 2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh)).sum(-1)
    return torch.tanh(pre_tanh), log_prob


class SDESquashedGaussianPolicy(HeldNoise, SquashedGaussianPolicy):
    """SAC's actor exploring with gSDE (``shoal.models.sde``): ``actor`` is the hidden layers, whose
    output ``f(s)`` feeds the mean head (clipped to ``[-MEAN_CLIP, MEAN_CLIP]`` before the tanh, as
    Stable-Baselines3's gSDE actor) and the noise ``f(s) @ W``. Collecting, each agent row keeps its
    ``W`` as gSDE holds it; learning draws one ``W`` for each batch it samples actions for (as
    Stable-Baselines3 does at each gradient step), reparameterized, so the gradient reaches the
    std matrix and the features."""

    MEAN_CLIP = 2.0

    def __init__(
        self,
        trunk: nn.Module,
        features: int,
        action: ActionSpec,
        obs_normalizer: ObsNormalizer | None,
        log_std_init: float,
        sample_freq: int,
    ):
        super().__init__(trunk, action, obs_normalizer)
        self.mean_head = nn.Linear(features, action.shape[0])
        self.sde = StateDependentNoise(features, action.shape[0], log_std_init, sample_freq)

    def mean_and_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.actor(x)
        return self.mean_head(features).clamp(-self.MEAN_CLIP, self.MEAN_CLIP), features

    def sample(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, features = self.mean_and_features(x)
        log_std = self.sde.log_std
        pre_tanh = mean + features @ (torch.randn_like(log_std) * log_std.exp())  # one matrix for the batch
        log_prob, _ = DiagGaussian.log_prob_entropy(mean, sde_log_scale(features, log_std), pre_tanh, False)
        return squashed(pre_tanh, log_prob)

    def unit_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return torch.tanh(self.mean_and_features(x)[0])
        return self.sample(x)[0]

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
        """Each row's held noise on its mean (uniform random actions before learning starts, the
        mean with ``deterministic``); no extras."""
        if action_mask is not None or deterministic or self.random_actions:
            return super().act(obs, state, first, action_mask, deterministic=deterministic, out=out)
        mean, features = self.mean_and_features(self.features(obs))
        unit = torch.tanh(mean + sde_noise(features, self.sde.matrices(state)))
        return self.to_env(unit), out if out is not None else TensorDict({}, batch_size=[len(obs)]), state


class DeterministicPolicy(BoundedActorPolicy):
    """TD3's actor: ``tanh(actor(obs))``, explored with noise of scale ``noise`` (in unit actions: a
    share of the half range), clipped to the bounds.

    ``noise_type="normal"``: Gaussian noise of std ``noise``, drawn afresh at every step.
    ``"ornstein-uhlenbeck"``: each agent row's noise follows an Ornstein-Uhlenbeck process,
    ``x <- x - OU_THETA * x * OU_DT + noise * sqrt(OU_DT) * N(0, 1)`` (Stable-Baselines3's constants),
    from 0 at each episode start, so successive pushes are correlated, as physical control tasks
    with momentum reward (Lillicrap et al. 2016). Each row's ``x`` is its policy state, which the
    collector carries."""

    OU_THETA, OU_DT = 0.15, 1e-2

    def __init__(
        self,
        actor: nn.Module,
        action: ActionSpec,
        obs_normalizer: ObsNormalizer | None,
        noise: float,
        noise_type: str = "normal",
    ):
        super().__init__(actor, action, obs_normalizer)
        self.noise = noise
        self.correlated = noise_type == "ornstein-uhlenbeck"

    def initial_state(self, rows: int) -> TensorDict:
        if not self.correlated:
            return super().initial_state(rows)
        device = self.center.device
        return TensorDict({"ou_noise": torch.zeros(rows, *self.center.shape, device=device)}, [rows], device=device)

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
        """With Ornstein-Uhlenbeck noise, each row's process steps once (restarting from 0 where
        ``first``) and is added to the mean action; otherwise as ``ReplayActorPolicy.act``."""
        if not self.correlated or action_mask is not None or deterministic or self.random_actions:
            return super().act(obs, state, first, action_mask, deterministic=deterministic, out=out)
        x = state["ou_noise"].masked_fill_(first.unsqueeze(1), 0.0)
        x.add_(x, alpha=-self.OU_THETA * self.OU_DT).add_(torch.randn_like(x), alpha=self.noise * self.OU_DT**0.5)
        unit = (self.mean_action(self.features(obs)) + x).clamp_(-1.0, 1.0)
        return self.to_env(unit), out if out is not None else TensorDict({}, batch_size=[len(obs)]), state

    def mean_action(self, x: torch.Tensor, actor: nn.Module | None = None) -> torch.Tensor:
        """Unit actions for the features ``x`` by ``actor`` (default: the policy's own; the learner
        passes its target copy)."""
        return torch.tanh((self.actor if actor is None else actor)(x))

    def unit_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        action = self.mean_action(x)
        if deterministic or not self.noise:
            return action
        return action.add_(torch.randn_like(action), alpha=self.noise).clamp_(-1.0, 1.0)

    def critic_action(self, x: torch.Tensor, actor: nn.Module | None = None) -> torch.Tensor:
        """The actions of ``actor`` (default: the policy's own; a learner passes its target copy) as
        the critics read them, differentiable with respect to the actor's weights: unit actions."""
        return self.mean_action(x, actor)


class GumbelSoftmaxPolicy(ReplayActorPolicy):
    """MADDPG's actor for Discrete actions: logits from the actor network. Acting samples the
    categorical they define (the argmax with ``deterministic``); critics read actions as one-hots,
    and the actor's own as a straight-through Gumbel-Softmax sample (Jang et al. 2017): a hard
    one-hot forward, the gradient of the relaxed sample at ``temperature`` backward
    (arXiv:1611.01144)."""

    def __init__(self, actor: nn.Module, num_actions: int, obs_normalizer: ObsNormalizer | None, temperature: float):
        super().__init__(actor, obs_normalizer)
        self.num_actions, self.temperature = num_actions, temperature

    def random_action(self, rows: int, device: torch.device) -> torch.Tensor:
        return torch.randint(self.num_actions, (rows,), device=device)

    def policy_action(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        logits = cast(torch.Tensor, self.actor(x))
        if not deterministic:  # the Gumbel-max trick: argmax(logits + Gumbel noise) samples the categorical
            logits = logits - torch.empty_like(logits).exponential_().log_()
        return logits.argmax(-1)

    def critic_action(self, x: torch.Tensor, actor: nn.Module | None = None) -> torch.Tensor:
        """``DeterministicPolicy.critic_action`` for Discrete actions: straight-through one-hots."""
        logits = cast(torch.Tensor, (self.actor if actor is None else actor)(x))
        gumbel = -torch.empty_like(logits).exponential_().log_()
        soft = ((logits + gumbel) / self.temperature).softmax(-1)
        hard = nn.functional.one_hot(soft.argmax(-1), self.num_actions).to(soft.dtype)
        return hard - soft.detach() + soft

    def critic_input(self, action: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(action, self.num_actions).float()


def network_sizes(
    config: TrainerConfig, env: EnvInfo, defaults: tuple[int, ...], algo: str = "SAC and TD3"
) -> tuple[list[int], str]:
    """The hidden sizes and activation of a replay actor-critic's networks: ``model_config``'s
    ``hiddens`` and ``activation``, else ``defaults`` and ReLU; what ``algo`` cannot build is
    refused by name."""
    if config.model != "mlp":
        raise ConfigError(
            f"{algo} build their own MLP actors and critics (model='mlp'); model={config.model!r} is not "
            f"supported for them."
        )
    options = config.model_options
    extra = sorted(set(options) - {"hiddens", "activation"})
    if extra:
        raise ConfigError(f"{algo} read model_config keys 'hiddens' and 'activation' only; got {extra}.")
    if env.critic_dim:
        raise ConfigError(f"central_critic is for on-policy actor-critics; {algo} have critics of their own.")
    if env.mask_size:
        raise ConfigError(f"{algo} do not take action masks, which '{env.name}' sends; use algo=dqn or algo=ppo.")
    return list(options.get("hiddens", defaults)), str(options.get("activation", "relu"))


def build_bounded_policy(
    config: TrainerConfig,
    env: EnvInfo,
    defaults: tuple[int, ...],
    noise: float | None = None,
    noise_type: str = "normal",
) -> BoundedActorPolicy:
    """SAC's squashed Gaussian actor, or with an exploration ``noise`` (of ``noise_type``) TD3's deterministic one."""
    hiddens, activation = network_sizes(config, env, defaults)
    if env.act_spec.kind != "continuous":
        raise ConfigError(
            f"SAC and TD3 need Box actions; '{env.name}' acts in {env.act_spec.space}. For Discrete actions use "
            f"algo=dqn or algo=ppo."
        )
    obs_dim, act_dim = int(np.prod(env.obs_spec.shape)), env.act_spec.shape[0]
    normalizer = obs_normalizers(config, env)[0]
    if noise is None and getattr(config, "use_sde", False):
        trunk = hidden_layers(obs_dim, hiddens, activation)  # its output is gSDE's features
        sample_freq = cast(int, getattr(config, "sde_sample_freq", -1))
        return SDESquashedGaussianPolicy(trunk, hiddens[-1], env.act_spec, normalizer, config.log_std_init, sample_freq)
    if noise is None:
        return SquashedGaussianPolicy(feedforward(obs_dim, hiddens, 2 * act_dim, activation), env.act_spec, normalizer)
    actor = feedforward(obs_dim, hiddens, act_dim, activation)
    return DeterministicPolicy(actor, env.act_spec, normalizer, noise, noise_type)


def build_critic(config: TrainerConfig, env: EnvInfo, defaults: tuple[int, ...], towers: int = 2) -> QTowers:
    """``towers`` Q-networks over one policy's observation features and unit action."""
    hiddens, activation = network_sizes(config, env, defaults)
    return QTowers(int(np.prod(env.obs_spec.shape)) + env.act_spec.shape[0], hiddens, towers, activation)
