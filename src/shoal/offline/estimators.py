"""Off-policy evaluation: the expected discounted return of a target policy pi from the start state,
estimated from episodes logged by a behaviour policy mu, as pure functions over padded ``[E, T]``
episode tensors (``valid_t`` False at the padding after an episode's end).

- ``importance_sampling`` is unbiased when mu > 0 wherever pi > 0 and the logged probabilities are
  exact, but its variance grows with the products of ratios pi/mu: fast in the horizon and in the
  distance between the two policies.
- ``weighted_importance_sampling`` divides by the mean weight at each step: biased for few episodes
  (the bias falls as 1/E), bounded by the rewards, and usually much less variable than IS.
- ``direct_method`` averages a model's values of the start states: little variance, but every error
  of the model (its function class, the data's coverage of pi's states and actions) is bias.
- ``doubly_robust`` uses the model as a control variate for IS: as unbiased as IS whatever the model
  (given ``v_t = sum_a pi(a|s) q_hat(s, a)``), and the better the model the lower its variance.
- ``fitted_q_evaluation`` fits that model.

Capping the ratios (``clip_ratio``) trades variance for bias in every estimator that uses them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "Estimate",
    "direct_method",
    "doubly_robust",
    "fitted_q_evaluation",
    "importance_sampling",
    "weighted_importance_sampling",
]


@dataclass(frozen=True, eq=False)
class Estimate:
    """An estimate ``value`` of the target policy's expected discounted return from the start state,
    the mean of ``per_episode`` (``[E]``, each episode's term; for WIS they share the normaliser)."""

    value: float
    per_episode: torch.Tensor

    @property
    def std_error(self) -> float:
        """``std(per_episode) / sqrt(E)``, the standard error of ``value`` (0 for one episode)."""
        n = self.per_episode.numel()
        return float(self.per_episode.std()) / math.sqrt(n) if n > 1 else 0.0


def importance_sampling(
    reward_t: torch.Tensor,
    valid_t: torch.Tensor,
    behaviour_log_prob_t: torch.Tensor,
    target_log_prob_t: torch.Tensor,
    *,
    gamma: float,
    clip_ratio: float | None = None,
) -> Estimate:
    """Per-decision importance sampling (Precup, Sutton & Singh 2000): each episode's
    ``sum_t gamma**t * w_t * r_t`` with ``w_t = prod_{k<=t} pi(a_k|s_k) / mu(a_k|s_k)``, averaged.

    Args:
      reward_t: ``[E, T]`` float, the reward of the action logged at step t.
      valid_t: ``[E, T]`` bool, True at an episode's steps (every episode has step 0), False at the
        padding after its end; padding is never read.
      behaviour_log_prob_t: ``[E, T]``, ``log mu(a_t|s_t)`` of the logged action, finite.
      target_log_prob_t: ``[E, T]``, ``log pi(a_t|s_t)``; -inf where pi never takes it.
      gamma: the discount, in [0, 1].
      clip_ratio: None, or each step's ratio ``pi/mu`` is capped at it before the product (> 0).
    The float tensors share ``reward_t``'s dtype.
    """
    w = _weights((reward_t, valid_t, behaviour_log_prob_t, target_log_prob_t), gamma, clip_ratio)
    return _estimate((w * _masked(reward_t, valid_t) * _discounts(reward_t, gamma)).sum(1))


def weighted_importance_sampling(
    reward_t: torch.Tensor,
    valid_t: torch.Tensor,
    behaviour_log_prob_t: torch.Tensor,
    target_log_prob_t: torch.Tensor,
    *,
    gamma: float,
    clip_ratio: float | None = None,
) -> Estimate:
    """Step-wise weighted importance sampling (Mahmood, van Hasselt & Sutton 2014; Thomas 2015,
    ch. 3): per-decision IS with each step's weight ``w_t`` divided by its mean over the episodes.

    An episode that has ended is in an absorbing state with reward 0 where no decision is taken: its
    weight stays at its last ``w`` and still counts in the mean at every later step. The mean then
    estimates ``E_mu[w_t] = 1`` at every step; averaging over only the episodes still running would
    ignore how pi changes the chance of still running. A step whose weights are all 0 adds 0.
    ``per_episode`` is ``E`` times each episode's normalised share. Arguments as for
    ``importance_sampling``.
    """
    w = _weights((reward_t, valid_t, behaviour_log_prob_t, target_log_prob_t), gamma, clip_ratio)
    mean = w.mean(0)
    normalised = torch.where(mean > 0, w / mean, 0.0)
    return _estimate((normalised * _masked(reward_t, valid_t) * _discounts(reward_t, gamma)).sum(1))


def direct_method(v_t: torch.Tensor, valid_t: torch.Tensor) -> Estimate:
    """The direct method (Dudik, Langford & Li 2011; with an FQE model, Le, Voloshin & Yue 2019): the
    mean over episodes of a model's value ``v_t[:, 0] = sum_a pi(a|s_0) q_hat(s_0, a)`` of the start
    state. Only column 0 of ``v_t`` (``[E, T]`` float, as for ``doubly_robust``) is read."""
    _check_episodes(v_t, valid_t, {}, name="v_t")
    return _estimate(v_t[:, 0])


def doubly_robust(
    reward_t: torch.Tensor,
    valid_t: torch.Tensor,
    behaviour_log_prob_t: torch.Tensor,
    target_log_prob_t: torch.Tensor,
    q_t: torch.Tensor,
    v_t: torch.Tensor,
    *,
    gamma: float,
    clip_ratio: float | None = None,
) -> Estimate:
    """Step-wise doubly robust estimator (Jiang & Li 2016; Thomas & Brunskill 2016): each episode's
    ``sum_t gamma**t * (w_t * (r_t - q_t) + w_{t-1} * v_t)``, with ``w_{-1} = 1``, averaged.

    The other arguments are ``importance_sampling``'s. With ``q_t = v_t = 0`` this is IS.

    Args:
      q_t: ``[E, T]``, the model's ``q_hat(s_t, a_t)`` of the logged action.
      v_t: ``[E, T]``, the model's ``sum_a pi(a|s_t) q_hat(s_t, a)`` of the step's state.
    """
    w = _weights((reward_t, valid_t, behaviour_log_prob_t, target_log_prob_t, q_t, v_t), gamma, clip_ratio)
    w_before = torch.cat((torch.ones_like(w[:, :1]), w[:, :-1]), 1)
    terms = w * (_masked(reward_t, valid_t) - _masked(q_t, valid_t)) + w_before * _masked(v_t, valid_t)
    return _estimate((terms * _discounts(reward_t, gamma)).sum(1))


def fitted_q_evaluation(
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    next_obs: torch.Tensor,
    terminated: torch.Tensor,
    next_action_probs: torch.Tensor,
    *,
    gamma: float,
    iterations: int = 50,
    hidden: int | Sequence[int] = (64, 64),
    epochs_per_iteration: int = 20,
    lr: float = 1e-3,
    batch_size: int | None = 256,
    seed: int = 0,
) -> nn.Module:
    """Fitted Q Evaluation (Le, Voloshin & Yue 2019) of a target policy pi over discrete actions.

    Each iteration regresses ``Q(s, a)`` onto ``r + gamma * (1 - terminated) * sum_a' pi(a'|s') *
    Q_prev(s', a')``, the targets computed once from the previous iteration's model.

    Args:
      obs: ``[B, D]`` float, the transitions' observations.
      action: ``[B]`` int64, the logged actions, in ``[0, A)``.
      reward: ``[B]`` float.
      next_obs: ``[B, D]`` float, the next observations.
      terminated: ``[B]`` bool, no bootstrap (``next_obs`` is not read).
      next_action_probs: ``[B, A]`` float, ``pi(.|s')`` at each next observation.
      gamma: the discount, in [0, 1].
      iterations: the number of regressions, >= 1.
      hidden: the MLP's hidden widths (ReLU). 0 or empty: a linear model with a bias, starting from
        0 and solved exactly by least squares each iteration (minimum norm: an action never logged
        gets Q 0), so one-hot features give tabular FQE; the MLP-only arguments below are unused then.
        Its design matrix is ``[B, A * (D + 1)]``: meant for small feature sets.
      epochs_per_iteration: Adam's passes over the data per iteration.
      lr: Adam's step size.
      batch_size: Adam's minibatch size (None: the whole batch).
      seed: the MLP's initialisation and minibatch order; the same seed gives the same model.

    Returns:
      A frozen module mapping ``[N, D]`` observations to ``[N, A]`` Q-values, in ``obs``'s dtype.
    """
    b, d, n_actions = _check_transitions(obs, action, reward, next_obs, terminated, next_action_probs, gamma=gamma)
    widths = [d, *(w for w in ([hidden] if isinstance(hidden, int) else hidden) if w)]
    if min(iterations, epochs_per_iteration, 1 if batch_size is None else batch_size, *widths[1:]) < 1 or not lr > 0:
        raise ValueError(
            f"iterations={iterations}, epochs_per_iteration={epochs_per_iteration}, batch_size={batch_size}, "
            f"hidden={hidden}, lr={lr}: expected integers >= 1 (hidden: or 0; batch_size: or None), lr > 0"
        )

    def targets(model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            next_value = (next_action_probs * model(next_obs)).sum(1)
            return reward + gamma * torch.where(terminated, 0.0, next_value)

    if len(widths) == 1:  # one least-squares problem over features one_hot(a) x [s, 1], the same every iteration
        design = obs.new_zeros(b, n_actions, d + 1)
        design[torch.arange(b, device=obs.device), action] = torch.cat((obs, obs.new_ones(b, 1)), 1)
        solve = torch.linalg.pinv(design.reshape(b, -1))
        linear = nn.Linear(d, n_actions, device=obs.device, dtype=obs.dtype).requires_grad_(False)
        linear.weight.zero_()  # Q_0 = 0: iteration k fits the k-step values
        linear.bias.zero_()
        for _ in range(iterations):
            coefficients = (solve @ targets(linear)).reshape(n_actions, d + 1)
            linear.weight.copy_(coefficients[:, :d])
            linear.bias.copy_(coefficients[:, d])
        return linear.eval()
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
        torch.manual_seed(seed)
        layers = [m for i, o in itertools.pairwise(widths) for m in (nn.Linear(i, o), nn.ReLU())]
        model = nn.Sequential(*layers, nn.Linear(widths[-1], n_actions)).to(device=obs.device, dtype=obs.dtype)
    generator = torch.Generator().manual_seed(seed)  # on the CPU: the same order on any device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(iterations):
        target = targets(model)
        for _ in range(epochs_per_iteration):
            for rows in torch.split(torch.randperm(b, generator=generator).to(obs.device), batch_size or b):
                q = model(obs[rows]).gather(1, action[rows, None]).squeeze(1)
                loss = nn.functional.mse_loss(q, target[rows])
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
                optimizer.step()
    return model.requires_grad_(False).eval()


def _estimate(per_episode: torch.Tensor) -> Estimate:
    return Estimate(float(per_episode.mean()), per_episode)


def _masked(x_t: torch.Tensor, valid_t: torch.Tensor) -> torch.Tensor:
    return torch.where(valid_t, x_t, 0.0)  # where, not a product: nan in the padding stays out


def _discounts(reward_t: torch.Tensor, gamma: float) -> torch.Tensor:
    return gamma ** torch.arange(reward_t.shape[1], dtype=reward_t.dtype, device=reward_t.device)


def _weights(tensors: tuple[torch.Tensor, ...], gamma: float, clip_ratio: float | None) -> torch.Tensor:
    """``tensors``: ``(reward_t, valid_t, behaviour_log_prob_t, target_log_prob_t[, q_t, v_t])``, checked;
    returns ``w_t = prod_{k<=t} rho_k`` ``[E, T]``, ``rho = pi/mu`` (capped at ``clip_ratio``) at an
    episode's steps and 1 in its padding, where ``w`` stays at the episode's last value."""
    reward_t, valid_t, behaviour_log_prob_t, target_log_prob_t = tensors[:4]
    names = ("behaviour_log_prob_t", "target_log_prob_t", "q_t", "v_t")
    _check_episodes(reward_t, valid_t, dict(zip(names, tensors[2:])))
    _check_gamma(gamma)
    if clip_ratio is not None and not clip_ratio > 0:  # also rejects nan
        raise ValueError(f"clip_ratio={clip_ratio} must be > 0 or None: it caps each step's ratio pi/mu")
    if not torch.isfinite(behaviour_log_prob_t[valid_t]).all():
        raise ValueError("behaviour_log_prob_t is not finite at a valid step: mu must give the logged action p > 0")
    if (target_log_prob_t[valid_t].isnan() | (target_log_prob_t[valid_t] == math.inf)).any():
        raise ValueError("target_log_prob_t is nan or +inf at a valid step, expected a log probability <= 0")
    ratio = (target_log_prob_t - behaviour_log_prob_t).exp()
    if clip_ratio is not None:
        ratio = ratio.clamp(max=clip_ratio)
    return torch.where(valid_t, ratio, 1.0).cumprod(1)


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:  # also rejects nan
        raise ValueError(f"gamma={gamma} must be in [0, 1]: the discount")


def _check_episodes(
    x_t: torch.Tensor, valid_t: torch.Tensor, floats: dict[str, torch.Tensor], name: str = "reward_t"
) -> None:
    """``x_t`` ``[E, T]`` float with E, T >= 1; ``floats`` of its shape and dtype; ``valid_t`` of its
    shape, bool, True at step 0 and never True after a False (an episode, then padding)."""
    if x_t.dim() != 2 or 0 in x_t.shape:
        raise ValueError(f"{name} has shape {tuple(x_t.shape)}, expected [E, T] with E, T >= 1 (episodes, steps)")
    if not x_t.is_floating_point():
        raise ValueError(f"{name} has dtype {x_t.dtype}, expected a floating point dtype")
    for other, x in {"valid_t": valid_t, **floats}.items():
        if x.shape != x_t.shape:
            raise ValueError(f"{other} has shape {tuple(x.shape)}, expected {tuple(x_t.shape)} like {name}")
    if valid_t.dtype != torch.bool:
        raise ValueError(f"valid_t has dtype {valid_t.dtype}, expected torch.bool (False: padding after the end)")
    for other, x in floats.items():
        if x.dtype != x_t.dtype:
            raise ValueError(f"{other} has dtype {x.dtype}, expected {x_t.dtype} like {name}")
    bad = ~valid_t[:, 0] | (valid_t[:, 1:] & ~valid_t[:, :-1]).any(1)
    if bad.any():
        raise ValueError(f"valid_t row {int(bad.nonzero()[0])} is not True from step 0 to its end, then False")


def _check_transitions(obs: torch.Tensor, *tensors: torch.Tensor, gamma: float) -> tuple[int, int, int]:
    """``fitted_q_evaluation``'s tensors and gamma; returns (B, D, A)."""
    action, reward, next_obs, terminated, next_action_probs = tensors
    if obs.dim() != 2 or obs.shape[0] < 1 or not obs.is_floating_point():
        raise ValueError(f"obs has shape {tuple(obs.shape)} and dtype {obs.dtype}, expected [B, D] float with B >= 1")
    b, d = obs.shape
    if next_action_probs.dim() != 2 or next_action_probs.shape[0] != b or next_action_probs.shape[1] < 1:
        raise ValueError(f"next_action_probs has shape {tuple(next_action_probs.shape)}, expected ({b}, A), A >= 1")
    a = next_action_probs.shape[1]
    expected = {
        "action": (action, (b,), torch.int64),
        "reward": (reward, (b,), obs.dtype),
        "next_obs": (next_obs, (b, d), obs.dtype),
        "terminated": (terminated, (b,), torch.bool),
        "next_action_probs": (next_action_probs, (b, a), obs.dtype),
    }
    for name, (x, shape, dtype) in expected.items():
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape} for obs {(b, d)}")
        if x.dtype != dtype:
            raise ValueError(f"{name} has dtype {x.dtype}, expected {dtype}")
    if action.min() < 0 or action.max() >= a:
        raise ValueError(f"action holds {int(action.min())}..{int(action.max())}, expected actions in [0, {a})")
    _check_gamma(gamma)
    return b, d, a
