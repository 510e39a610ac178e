"""Advantage estimators as pure functions, checked against slow loops in tests/test_advantages.py."""

from __future__ import annotations

import torch


def gae(reward_t: torch.Tensor, value_t: torch.Tensor, terminated_t: torch.Tensor, truncated_t: torch.Tensor,
        final_value_t: torch.Tensor, gamma: float, gae_lambda: float) -> torch.Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438), batched over rows.

    Args:
      reward_t: ``[N, T]`` reward of the transition taken at step t.
      value_t: ``[N, T+1]`` value of the observation at step t; ``value_t[:, T]`` bootstraps the tail.
      terminated_t: ``[N, T]`` episode ended in a terminal state at t: no bootstrap.
      truncated_t: ``[N, T]`` episode was cut at t (time limit): bootstrap from ``final_value_t``,
        the value of the true final observation, since ``value_t[:, t+1]`` is the next episode's.
      final_value_t: ``[N, T]`` see above; read only where ``truncated_t``.
    Returns:
      ``[N, T]`` advantages. The recursion is cut at every done (terminated or truncated) step.
    """
    n, t = reward_t.shape
    if value_t.shape != (n, t + 1):
        raise ValueError(f"value_t has shape {tuple(value_t.shape)}, expected {(n, t + 1)} for reward_t {(n, t)}")
    for name, x in (("terminated_t", terminated_t), ("truncated_t", truncated_t), ("final_value_t", final_value_t)):
        if x.shape != (n, t):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {(n, t)} like reward_t")
    next_value = torch.where(truncated_t, final_value_t, value_t[:, 1:])
    not_terminal = (~terminated_t).float()
    delta = reward_t + gamma * next_value * not_terminal - value_t[:, :-1]
    carry = gamma * gae_lambda * (~(terminated_t | truncated_t)).float()
    # The time loop stays in Python. Time-major copies make each step's rows one contiguous slice,
    # so a step is a single fused op writing straight into the result.
    delta, carry = delta.t().contiguous().unbind(0), carry.t().contiguous().unbind(0)
    advantage = torch.empty(t, n, dtype=reward_t.dtype, device=reward_t.device)
    adv = advantage.unbind(0)
    adv[t - 1].copy_(delta[t - 1])
    for step in range(t - 2, -1, -1):
        torch.addcmul(delta[step], carry[step], adv[step + 1], out=adv[step])
    return advantage.t()
