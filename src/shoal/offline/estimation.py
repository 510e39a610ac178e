"""``off_policy_estimation_methods``: the current policy's return estimated on a recorded dataset,
reported with each evaluation.

The first ``off_policy_estimation_episodes`` episodes of the dataset are read once and padded to
``[E, T]``; at each evaluation the policy's probabilities of the recorded actions are computed and
each method (``shoal.offline.estimators``) estimates the discounted return (``gamma``) from the
episodes' first states. ``dm`` and ``dr`` fit a Q-function of the policy by fitted Q evaluation
first. The behaviour policy's own discounted return on the same episodes, ``v_behaviour``, is
reported beside them. Discrete actions: the probabilities of every action are needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from shoal.models.policy import ActorCriticPolicy, Policy
from shoal.models.qpolicy import QPolicy
from shoal.offline import estimators
from shoal.offline.minari_files import DatasetError
from shoal.offline.reader import Source, check_episode

if TYPE_CHECKING:
    from shoal.envs.spaces import EnvInfo

NEEDS_BEHAVIOUR = ("is", "wis", "dr")
FQE_DEFAULTS: dict[str, Any] = {"epochs_per_iteration": 1, "hidden": (64, 64)}
"""Fitted Q evaluation's settings unless ``off_policy_estimation_config`` says otherwise; its
``iterations`` come from ``gamma`` (``fqe_iterations``)."""


def fqe_iterations(gamma: float) -> int:
    """Regressions enough for values ``gamma`` discounts over its horizon: after ``k`` of them a
    value holds at most ``k`` discounted rewards, so ``k = 3 / (1 - gamma)`` (at most 300) reaches
    95% of an infinite horizon's (on CartPole with gamma 0.99, 20 reached 18.2 of 99.3)."""
    return 300 if gamma >= 0.99 else max(1, math.ceil(3 / (1 - gamma)))


@dataclass
class LoggedEpisodes:
    """Recorded episodes padded to ``[E, T]`` (``obs`` ``[E, T + 1, ...]``)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    valid: torch.Tensor
    behaviour_log_prob: torch.Tensor | None
    """None when the dataset did not record it (``dm`` alone can run then)."""
    where: str
    action_mask: torch.Tensor | None = None
    """``[E, T + 1, A]`` bool: the legal actions at each observation, for a masked env (else None)."""


def load_logged(source: Source, episodes: int, env: EnvInfo, masked: bool) -> LoggedEpisodes:
    """The first ``episodes`` episodes of ``source``'s datasets (the estimated policy's own, in a
    run's output with several), each checked as training checks what it reads; with ``masked``
    their legal actions too (all legal where none were recorded)."""
    path = source.path
    read = []
    for file in source.files:
        for k, episode in enumerate(file.episodes()):
            check_episode(episode, f"dataset '{file.folder}' episode_{k}", env)
            read.append(episode)
            if len(read) == episodes:
                break
        if len(read) == episodes:
            break
    if not read:
        raise DatasetError(f"off_policy_estimation_input '{path}' holds no episodes.")
    e, t = len(read), max(len(ep) for ep in read)
    obs = np.zeros((e, t + 1, *read[0].observations.shape[1:]), dtype=np.float32)
    action = np.zeros((e, t), dtype=np.int64)
    reward = np.zeros((e, t), dtype=np.float32)
    terminated = np.zeros((e, t), dtype=bool)
    valid = np.zeros((e, t), dtype=bool)
    logp = np.full((e, t), np.nan, dtype=np.float32)
    mask = np.ones((e, t + 1, int(env.act_spec.nvec[0])), dtype=bool) if masked else None
    for i, ep in enumerate(read):
        n = len(ep)
        obs[i, : n + 1], action[i, :n], reward[i, :n] = ep.observations, ep.actions, ep.rewards
        terminated[i, :n], valid[i, :n] = ep.terminations, True
        if "action_log_prob" in ep.infos:
            logp[i, :n] = ep.infos["action_log_prob"][:n]
        if mask is not None and "action_mask" in ep.infos:
            mask[i, : n + 1] = ep.infos["action_mask"].astype(bool)
    known = bool(np.isfinite(logp[valid]).all())
    return LoggedEpisodes(
        obs=torch.from_numpy(obs),
        action=torch.from_numpy(action),
        reward=torch.from_numpy(reward),
        terminated=torch.from_numpy(terminated),
        valid=torch.from_numpy(valid),
        behaviour_log_prob=torch.from_numpy(logp) if known else None,
        where=str(path),
        action_mask=None if mask is None else torch.from_numpy(mask),
    )


def check_methods(logged: LoggedEpisodes, methods: list[str]) -> None:
    """The ``methods`` can run on ``logged``: the importance-weighted ones need the behaviour policy's
    probabilities."""
    if logged.behaviour_log_prob is None and (missing := [m for m in methods if m in NEEDS_BEHAVIOUR]):
        raise DatasetError(
            f"off_policy_estimation_methods {missing} need the behaviour policy's probabilities, which the dataset "
            f"'{logged.where}' does not hold (infos 'action_log_prob'); 'dm' needs none."
        )


@torch.no_grad()
def action_probabilities(
    policy: Policy, obs: torch.Tensor, deterministic: bool, actions: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, A]``: the probability the policy takes each action at ``obs`` (among the legal ones of
    ``mask``, as it acts): its most likely action with ``deterministic``; else its distribution
    (epsilon-greedy for Q-policies, the random share spread over the legal actions). A feedforward
    policy: each step is read alone."""
    rows = len(obs)
    if isinstance(policy, QPolicy):
        q = policy.q_values(obs)
        legal = torch.ones_like(q, dtype=torch.bool) if mask is None else mask
        greedy = F.one_hot(q.masked_fill(~legal, -torch.inf).argmax(-1), actions).float()
        eps = 0.0 if deterministic else float(policy.epsilon)
        return (1 - eps) * greedy + eps * legal / legal.sum(-1, keepdim=True)
    if deterministic or not isinstance(policy, ActorCriticPolicy):
        state, first = policy.initial_state(rows), torch.ones(rows, dtype=torch.bool)
        action, _, _ = policy.act(obs, state, first, mask, deterministic=True)
        return F.one_hot(action.long(), actions).float()
    params, _ = policy(obs)
    each = [policy.score(params, torch.full((rows,), a, dtype=torch.long), False, mask)[0] for a in range(actions)]
    return torch.stack(each, dim=1).exp()


def estimate_policy(
    policy: Policy,
    logged: LoggedEpisodes,
    methods: list[str],
    *,
    gamma: float,
    deterministic: bool,
    actions: int,
    fqe: dict[str, Any],
    seed: int,
) -> dict[str, float]:
    """Each method's estimate of ``policy``'s discounted return from the episodes' first states,
    and ``v_behaviour``, the recorded episodes' own."""
    check_methods(logged, methods)
    e, t = logged.action.shape
    mask = None if logged.action_mask is None else logged.action_mask.flatten(0, 1)
    probs = action_probabilities(policy, logged.obs.flatten(0, 1), deterministic, actions, mask).view(e, t + 1, actions)
    taken = probs[:, :-1].gather(2, logged.action.unsqueeze(-1)).squeeze(-1)
    # -inf where the policy never takes the logged action: that episode weighs 0 from there on, also
    # in WIS, whose normaliser would bring back a weight merely made small
    target_logp = torch.where(logged.valid, taken.log(), 0.0)
    out: dict[str, float] = {}
    discounts = gamma ** torch.arange(t, dtype=torch.float32)
    out["v_behaviour"] = float((logged.reward * discounts * logged.valid).sum(1).mean())
    recorded = logged.behaviour_log_prob  # None only when no method that reads it was asked for
    behaviour = torch.zeros_like(target_logp) if recorded is None else torch.where(logged.valid, recorded, 0.0)
    q_t = v_t = None
    if "dm" in methods or "dr" in methods:
        q_t, v_t = _fitted_values(logged, probs, gamma, fqe, seed)
    for method in methods:
        if method == "is":
            est = estimators.importance_sampling(logged.reward, logged.valid, behaviour, target_logp, gamma=gamma)
        elif method == "wis":
            est = estimators.weighted_importance_sampling(
                logged.reward, logged.valid, behaviour, target_logp, gamma=gamma
            )
        elif method == "dm":
            assert v_t is not None
            est = estimators.direct_method(v_t, logged.valid)
        else:
            assert q_t is not None and v_t is not None
            est = estimators.doubly_robust(logged.reward, logged.valid, behaviour, target_logp, q_t, v_t, gamma=gamma)
        out[method] = est.value
    return out


def _fitted_values(
    logged: LoggedEpisodes, probs: torch.Tensor, gamma: float, fqe: dict[str, Any], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fitted Q evaluation of the policy on the logged transitions: ``q_t``, the value of each
    recorded action, and ``v_t``, each state's value under the policy (``[E, T]`` each)."""
    valid = logged.valid
    obs = logged.obs[:, :-1].flatten(2)
    next_obs = logged.obs[:, 1:].flatten(2)
    q_net = estimators.fitted_q_evaluation(
        obs[valid],
        logged.action[valid],
        logged.reward[valid],
        next_obs[valid],
        logged.terminated[valid],
        probs[:, 1:][valid],
        gamma=gamma,
        seed=seed,
        **(FQE_DEFAULTS | {"iterations": fqe_iterations(gamma)} | fqe),
    )
    with torch.no_grad():
        q = q_net(obs.flatten(0, 1)).view(*valid.shape, -1)
    q_t = q.gather(2, logged.action.unsqueeze(-1)).squeeze(-1)
    v_t = (q * probs[:, :-1]).sum(-1)
    return torch.where(valid, q_t, 0.0), torch.where(valid, v_t, 0.0)
