"""gSDE: generalized state-dependent exploration (Raffin et al. 2021, arXiv:2005.05719).

White Gaussian noise drawn at every step makes a jittery policy that explores little: successive
perturbations cancel out. gSDE makes the noise a function of the state instead. Each agent row
holds a matrix ``W ~ N(0, std^2)`` of shape ``[features, action dims]`` and adds ``f(s) @ W`` to
the mean action, where ``f(s)`` is the actor's last hidden layer. ``W`` is drawn afresh at the
start of every collection and every ``sde_sample_freq`` steps, so within that span the
perturbation is smooth in the state and the same state gets the same push. The ``std`` matrix is
learned (``log_std``, ``[features, action dims]``).

Given ``f(s)``, the action is Gaussian with mean ``mu(s)`` and per-dimension variance
``sum_i f_i(s)^2 std_ij^2``, so its log-probability and entropy are a diagonal Gaussian's with
that scale (``log_scale``). PPO's learner, like Stable-Baselines3's, takes ``f(s)`` as a constant
there; SAC's lets the gradient reach the features.

The per-row matrices live in the policy's per-row state, which the collector carries from step
to step through every backend (as a recurrent core's). The count of collections is a buffer, so
a policy acting in another process learns that a new one started from the weights it is sent,
and a checkpoint resumes with it.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from tensordict import TensorDict
from torch import nn

from shoal.envs.spaces import ActionSpec
from shoal.models.distributions import DiagGaussian
from shoal.models.normalize import ObsNormalizer
from shoal.models.policy import BOX_MASK_ERROR, ActorCriticPolicy

VARIANCE_FLOOR = 1e-6
"""Added to each action dimension's variance: features that are all 0 leave a finite log-probability."""


def sde_log_scale(features: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """``[B, A]``: log of the action noise's std given the features ``[B, F]`` and ``log_std [F, A]``."""
    variance = features.square() @ (2.0 * log_std).exp()
    return 0.5 * (variance + VARIANCE_FLOOR).log()


def sde_noise(features: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """``[B, A]``: each row's features ``[B, F]`` times its own noise matrix ``[B, F, A]``."""
    return torch.bmm(features.unsqueeze(1), matrices).squeeze(1)


class FeatureModel(Protocol):
    """A built-in model that also returns its actor's last hidden layer (``MLPModel``, ``EncoderModel``)."""

    def forward_features(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


class StateDependentNoise(nn.Module):
    """The learned ``log_std [F, A]`` and the per-row noise matrices, drawn when due.

    A row's state holds its matrix (flat, ``[F * A]``), the steps since it was drawn and the
    collection it was drawn in; ``matrices`` redraws the rows whose collection is past or whose
    ``sample_freq`` steps are up, in place. The collection count is a buffer, so a checkpoint
    resumes with the draws an unbroken run would make."""

    epoch: torch.Tensor

    def __init__(self, features: int, action_dims: int, log_std_init: float, sample_freq: int):
        super().__init__()
        self.log_std = nn.Parameter(torch.full((features, action_dims), float(log_std_init)))
        self.sample_freq = sample_freq
        self.register_buffer("epoch", torch.zeros((), dtype=torch.int64))
        """The collection under way: rows whose matrix was drawn in an earlier one draw again."""

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> TensorDict:
        """Rows with no matrix yet: the first noisy action draws one."""
        size = self.log_std.numel()
        return TensorDict(
            {
                "sde_noise": torch.zeros(rows, size, device=device),
                "sde_age": torch.zeros(rows, 1, dtype=torch.int64, device=device),
                "sde_epoch": torch.full((rows, 1), -1, dtype=torch.int64, device=device),
            },
            batch_size=[rows],
            device=device,
        )

    def matrices(self, state: TensorDict) -> torch.Tensor:
        """Each row's noise matrix ``[B, F, A]`` for this step (drawn where due), and a step counted."""
        age, epoch, noise = state["sde_age"], state["sde_epoch"], state["sde_noise"]
        due = epoch != self.epoch
        if self.sample_freq > 0:
            due |= age >= self.sample_freq
        if bool(due.any()):
            fresh = torch.randn_like(noise) * self.log_std.detach().exp().flatten()
            noise.copy_(torch.where(due, fresh, noise))
            age.masked_fill_(due, 0)
            epoch.copy_(self.epoch)
        age += 1
        matrices: torch.Tensor = noise.view(len(noise), *self.log_std.shape)
        return matrices


class HeldNoise:
    """What a gSDE policy adds to the policy contract: its rows' matrices as per-row state, and a
    new draw at each collection."""

    sde: StateDependentNoise

    def start_collection(self) -> None:
        self.sde.epoch += 1

    def initial_state(self, rows: int) -> TensorDict:
        return self.sde.initial_state(rows, self.sde.log_std.device)


class SDEActorCriticPolicy(HeldNoise, ActorCriticPolicy):
    """An actor-critic for Box actions that explores with gSDE (see the module docstring): the
    model's mean action plus ``f(s) @ W``. The deterministic action is the mean."""

    def __init__(
        self,
        model: nn.Module,
        action: ActionSpec,
        features: int,
        obs_normalizer: ObsNormalizer | None = None,
        critic_normalizer: ObsNormalizer | None = None,
        log_std_init: float = 0.0,
        sample_freq: int = -1,
    ):
        super().__init__(model, action, obs_normalizer, critic_normalizer, log_std_init)
        del self.log_std  # the state-independent std is replaced by the feature-dependent one
        self.sde = StateDependentNoise(features, action.shape[0], log_std_init, sample_freq)

    def forward_features(
        self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean actions ``[B, A]``, values ``[B]`` and the actor's features ``[B, F]`` of raw observations."""
        obs, critic_obs = self.normalize(obs, critic_obs)
        return cast(FeatureModel, self.model).forward_features(obs, critic_obs)

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
        """The mean plus each row's state-dependent noise (the mean alone with ``deterministic``,
        which leaves the rows' matrices as they are); extras as ``ActorCriticPolicy``'s."""
        if action_mask is not None:
            raise ValueError(BOX_MASK_ERROR)
        mean, value, features = self.forward_features(obs, critic_obs)
        action = mean if deterministic else mean + sde_noise(features, self.sde.matrices(state))
        logp, _ = DiagGaussian.log_prob_entropy(mean, sde_log_scale(features, self.sde.log_std), action, False)
        return action, self.write_extras(logp, value, out), state

    def evaluate(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        entropy: bool = True,
        action_mask: torch.Tensor | None = None,
        critic_obs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probability of ``action``, entropy and values, the features held constant."""
        mean, value, features = self.forward_features(obs, critic_obs)
        log_scale = sde_log_scale(features.detach(), self.sde.log_std)
        logp, ent = DiagGaussian.log_prob_entropy(mean, log_scale, action, entropy)
        return logp, ent, value
