"""Advantage estimators as pure functions, checked against slow loops in tests/test_advantages.py."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict

from shoal.imports import import_spec


def gae(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    valid_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438), batched over rows.

    Args:
      reward_t: ``[N, T]`` reward of the transition taken at step t.
      value_t: ``[N, T+1]`` value of the observation at step t; ``value_t[:, T]`` bootstraps the tail.
      terminated_t: ``[N, T]`` episode ended in a terminal state at t: no bootstrap.
      truncated_t: ``[N, T]`` episode was cut at t (time limit): bootstrap from ``final_value_t``,
        the value of the true final observation, since ``value_t[:, t+1]`` is the next episode's.
      final_value_t: ``[N, T]`` see above; read only where ``truncated_t``.
      valid_t: ``[N, T]`` bool, the row took a real decision at t; None means every step is one.
        A non-decision step (padding of a dead agent, the opponent's turn, a next-step reset) is
        not a time step of its row: its reward is added undiscounted to the row's previous
        decision in the rollout, and its done flag ends that decision's episode (terminated: no
        bootstrap; truncated: bootstrap from its ``final_value_t``). Steps after a done are the
        next episode's and never fold back across it. A decision bootstraps from the value at the
        row's next decision, or from ``value_t[:, T]`` when none follows in the rollout. Leading
        non-decision steps belong to a decision of the previous rollout and are dropped.
    Returns:
      ``[N, T]`` advantages, 0 at non-decision steps (every loss masks them out). The recursion is
      cut at every done (terminated or truncated) step.
    """
    n, t = reward_t.shape
    if value_t.shape != (n, t + 1):
        raise ValueError(f"value_t has shape {tuple(value_t.shape)}, expected {(n, t + 1)} for reward_t {(n, t)}")
    for name, x in (
        ("terminated_t", terminated_t),
        ("truncated_t", truncated_t),
        ("final_value_t", final_value_t),
        ("valid_t", valid_t),
    ):
        if x is not None and x.shape != (n, t):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {(n, t)} like reward_t")
    if valid_t is None:
        next_value = torch.where(truncated_t, final_value_t, value_t[:, 1:])
        not_terminal = (~terminated_t).to(value_t.dtype)
        delta = reward_t + gamma * next_value * not_terminal - value_t[:, :-1]
        # in the values' dtype: a float32 mask would round gamma * lambda to float32 for float64 values
        carry = gamma * gae_lambda * (~(terminated_t | truncated_t)).to(value_t.dtype)
        return _backward_scan(delta, carry)
    delta, carry = _folded_terms(
        reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma, gae_lambda, valid_t
    )
    return _backward_scan(delta, carry).masked_fill_(~valid_t, 0.0)


def _folded_terms(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    valid_t: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``delta`` and ``carry`` such that ``x[t] = delta[t] + carry[t] * x[t+1]`` is the advantage at
    decisions when non-decision steps fold into the decision before them.

    At a non-decision step x is not an advantage but what it hands back to the previous decision:
    its own reward plus, unless it is done, what the next step hands back: ``gamma * (value +
    lambda * advantage)`` of a decision, or the x of another non-decision step unchanged (carry 1:
    folded rewards are not discounted). A truncated one adds ``gamma * final_value`` instead.
    With every step valid these are exactly the usual GAE delta and carry.
    """
    n = reward_t.shape[0]
    dtype = value_t.dtype
    not_done = (~(terminated_t | truncated_t)).to(dtype)
    is_decision = valid_t.to(dtype)
    # Whether step t+1 is a decision; the tail value always bootstraps, as a decision would.
    next_decision = torch.cat((is_decision[:, 1:], is_decision.new_ones(n, 1)), dim=1)
    bootstrap = torch.where(truncated_t & ~terminated_t, final_value_t, value_t[:, 1:] * not_done * next_decision)
    # Only a decision's own value is subtracted: at a non-decision step x is a target, not an advantage.
    delta = reward_t + gamma * bootstrap - value_t[:, :-1] * is_decision
    # full_like, not torch.where on Python floats, which would round gamma * lambda to float32
    carry = torch.full_like(not_done, gamma * gae_lambda).masked_fill_(~next_decision.bool(), 1.0) * not_done
    return delta, carry


def _backward_scan(delta: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """``x[:, t] = delta[:, t] + carry[:, t] * x[:, t+1]`` backwards from ``x[:, T-1] = delta[:, T-1]``."""
    n, t = delta.shape
    # The time loop stays in Python. Time-major copies make each step's rows one contiguous slice,
    # so a step is a single fused op writing straight into the result.
    deltas, carries = delta.t().contiguous().unbind(0), carry.t().contiguous().unbind(0)
    advantage = torch.empty(t, n, dtype=delta.dtype, device=delta.device)
    adv = advantage.unbind(0)
    adv[t - 1].copy_(deltas[t - 1])
    for step in range(t - 2, -1, -1):
        torch.addcmul(deltas[step], carries[step], adv[step + 1], out=adv[step])
    return advantage.t()


def rollout_gae(rollout: TensorDict, gamma: float, gae_lambda: float) -> torch.Tensor:
    """``gae`` over a ``[N, T+1]`` rollout's fields; non-decision steps are folded only when the
    rollout has any (padding rows and next-step resets exist only with some backends)."""
    valid = rollout["valid"][:, :-1]
    return gae(
        rollout["reward"][:, :-1],
        rollout["value"],
        rollout["terminated"][:, :-1],
        rollout["truncated"][:, :-1],
        rollout["final_value"][:, :-1],
        gamma,
        gae_lambda,
        valid_t=None if bool(valid.all()) else valid,
    )


AdvantageFn = Callable[[TensorDict, float, float], torch.Tensor]  # (rollout, gamma, gae_lambda) -> [N, T]
# name -> estimator; a 'package.module:function' of the same signature may be given instead
ESTIMATORS: dict[str, AdvantageFn] = {"gae": rollout_gae}


def advantage_estimator(spec: str) -> AdvantageFn:
    """The advantage function ``advantage_estimator`` names (checked when the config is built)."""
    if spec in ESTIMATORS:
        return ESTIMATORS[spec]
    estimator: AdvantageFn = import_spec(spec, "advantage_estimator")
    return estimator
