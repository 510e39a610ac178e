"""Advantage estimators as pure functions, checked against slow loops in tests/test_advantages.py,
tests/test_vtrace.py and tests/test_grpo.py (the group-relative one)."""

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
    _check_shapes(
        reward_t,
        value_t,
        terminated_t=terminated_t,
        truncated_t=truncated_t,
        final_value_t=final_value_t,
        valid_t=valid_t,
    )
    if valid_t is None:
        delta = _td_error(reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma)
        # in the values' dtype: a float32 mask would round gamma * lambda to float32 for float64 values
        carry = gamma * gae_lambda * (~(terminated_t | truncated_t)).to(value_t.dtype)
        return _backward_scan(delta, carry)
    delta, carry = _folded_terms(
        reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma, gae_lambda, valid_t
    )
    return _backward_scan(delta, carry).masked_fill_(~valid_t, 0.0)


def vtrace(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    ratio_t: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
    valid_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """V-trace-adjusted GAE (IMPALA, Espeholt et al. 2018, arXiv:1802.01561): ``v_s - V(x_s)`` for
    data collected by a behaviour policy mu that the learner's policy pi has since moved away from.

    Each TD error is weighted by its truncated importance ratio ``rho_t = min(rho_clip, pi/mu)``
    and the trace carried back through step t by ``c_t = gae_lambda * min(c_clip, pi/mu)``:
    ``x_t = rho_t * delta_t + gamma * c_t * x_{t+1}``, cut at every done. Clipping rho sets whose
    value the targets converge to: pi's when ``rho_clip`` is at least every ratio, below that a
    policy between mu and pi (mu's as it nears 0). Clipping c bounds the product of ratios a long
    trace multiplies, so a stale rollout's far future cannot swamp the near one. ``gae_lambda``
    inside c is the PufferLib / Metta form of PPO with V-trace: with every ratio 1 it is exactly
    ``gae``, and with lambda 1 as well, ``advantage + value`` is the n-step return bootstrapped at
    the end (the paper's on-policy remark).

    Args:
      reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma, gae_lambda, valid_t: as
        for ``gae``. Rows may be whole rollouts or bptt segments, whose last ``value_t`` column is
        the stored value of the step after the segment: a segment's trace ends there and
        bootstraps from that value.
      ratio_t: ``[N, T]`` ``pi(a_t|x_t) / mu(a_t|x_t)`` under the current policy, read only at
        decisions; at a non-decision step (see ``gae``) no action was chosen, so its folded reward
        is weighted by the ratio of the decision it folds into.
      rho_clip, c_clip: the truncation levels rho-bar and c-bar of the paper, > 0.
    Returns:
      ``[N, T]`` advantages, 0 at non-decision steps.
    """
    _check_shapes(
        reward_t,
        value_t,
        terminated_t=terminated_t,
        truncated_t=truncated_t,
        final_value_t=final_value_t,
        ratio_t=ratio_t,
        valid_t=valid_t,
    )
    for name, clip in (("rho_clip", rho_clip), ("c_clip", c_clip)):
        if not clip > 0:  # also rejects nan
            raise ValueError(f"{name}={clip} must be > 0: it caps the importance ratio pi/mu")
    ratio = ratio_t.to(value_t.dtype)
    rho = ratio.clamp(max=rho_clip)
    not_done = (~(terminated_t | truncated_t)).to(value_t.dtype)
    # (gamma * lambda) * not_done first, as gae forms its carry, so ratios of 1 give gae bit for bit
    trace = gamma * gae_lambda * not_done * ratio.clamp(max=c_clip)
    if valid_t is None:
        delta = _td_error(reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma)
        return _backward_scan(delta.mul_(rho), trace)
    # Two scans: rho of a decision weights its folded one-step TD error, rewards of the steps folded
    # into it included, while the trace to the next decision is weighted by its c, which one
    # running sum cannot keep apart. The first scan folds: GAE at lambda 0.
    delta, fold = _folded_terms(reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma, 0.0, valid_t)
    # At a non-decision step the first scan holds a partial sum, not a TD error; rho 0 drops it
    # (and whatever ratio the step holds, nan say, never reaches a decision).
    delta = _backward_scan(delta, fold).mul_(rho.masked_fill_(~valid_t, 0.0))
    # A non-decision step hands the next decision's x back unchanged (the decision before it holds
    # its one gamma and c), unless it is done: then the decision's episode ended there.
    carry = torch.where(valid_t, trace, not_done)
    return _backward_scan(delta, carry).masked_fill_(~valid_t, 0.0)


def _check_shapes(reward_t: torch.Tensor, value_t: torch.Tensor, **per_step: torch.Tensor | None) -> None:
    """Raise ValueError naming the first argument whose shape does not fit ``reward_t``'s ``[N, T]``:
    a wrong shape would otherwise broadcast into advantages of the wrong rows without an error."""
    n, t = reward_t.shape
    if value_t.shape != (n, t + 1):
        raise ValueError(f"value_t has shape {tuple(value_t.shape)}, expected {(n, t + 1)} for reward_t {(n, t)}")
    for name, x in per_step.items():
        if x is not None and x.shape != (n, t):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {(n, t)} like reward_t")


def _td_error(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """The one-step TD error ``r + gamma * V(next) - V`` of every step, where a truncated step's next
    value is its ``final_value_t`` and a terminated step has none."""
    next_value = torch.where(truncated_t, final_value_t, value_t[:, 1:])
    not_terminal = (~terminated_t).to(value_t.dtype)
    return reward_t + gamma * next_value * not_terminal - value_t[:, :-1]


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


_SCAN_CHUNK = 128  # steps; 3 views each stay well below the 700 new objects that start a collection


def _backward_scan(delta: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """``x[:, t] = delta[:, t] + carry[:, t] * x[:, t+1]`` backwards from ``x[:, T-1] = delta[:, T-1]``."""
    n, t = delta.shape
    # The time loop stays in Python. Time-major copies make each step's rows one contiguous slice,
    # so a step is a single fused op writing straight into the result.
    deltas, carries = delta.t().contiguous(), carry.t().contiguous()
    advantage = torch.empty(t, n, dtype=delta.dtype, device=delta.device)
    following = advantage[t - 1].copy_(deltas[t - 1])
    # Per-step views are made _SCAN_CHUNK steps at a time: unbinding a long row whole keeps three
    # tensors per step alive at once, and that many new objects set off Python's full garbage
    # collections, which took longer than the scan itself on 8192-step rows.
    for end in range(t - 1, 0, -_SCAN_CHUNK):
        start = max(0, end - _SCAN_CHUNK)
        steps = zip(deltas[start:end].unbind(0), carries[start:end].unbind(0), advantage[start:end].unbind(0))
        for delta_s, carry_s, out in reversed(list(steps)):
            following = torch.addcmul(delta_s, carry_s, following, out=out)
    return advantage.t()


RolloutTerms = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _rollout_terms(rollout: TensorDict) -> tuple[RolloutTerms, torch.Tensor | None]:
    """A ``[N, T+1]`` rollout's ``(reward_t, value_t, terminated_t, truncated_t, final_value_t)``
    as the estimators take them, and ``valid_t``: None when every step is a decision (padding rows
    and next-step resets exist only with some backends), so nothing needs folding."""
    valid = rollout["valid"][:, :-1]
    terms = (
        rollout["reward"][:, :-1],
        rollout["value"],
        rollout["terminated"][:, :-1],
        rollout["truncated"][:, :-1],
        rollout["final_value"][:, :-1],
    )
    return terms, None if bool(valid.all()) else valid


def rollout_gae(rollout: TensorDict, gamma: float, gae_lambda: float) -> torch.Tensor:
    """``gae`` over a ``[N, T+1]`` rollout's fields."""
    terms, valid = _rollout_terms(rollout)
    return gae(*terms, gamma, gae_lambda, valid_t=valid)


def rollout_vtrace(
    rollout: TensorDict, gamma: float, gae_lambda: float, rho_clip: float = 1.0, c_clip: float = 1.0
) -> torch.Tensor:
    """``vtrace`` over a ``[N, T+1]`` rollout's fields, with the importance ratios of its float
    field ``ratio`` (pi/mu recomputed by the learner, 1 where unknown).

    A rollout without ``ratio`` has not been learnt from yet: its policy is the one that collected
    it, every ratio is 1 and the advantages are GAE's."""
    terms, valid = _rollout_terms(rollout)
    ratio = rollout["ratio"][:, :-1] if "ratio" in rollout.keys() else torch.ones_like(terms[0])  # noqa: SIM118 (a TensorDict)
    return vtrace(*terms, ratio, gamma, gae_lambda, rho_clip, c_clip, valid_t=valid)


def group_relative(
    reward: torch.Tensor, done: torch.Tensor, valid: torch.Tensor, group_size: int, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRPO's advantages (Shao et al. 2024, arXiv:2402.03300) over rows ``[N, T]`` in which each
    ``group_size`` consecutive rows form a group (envs reset from one seed).

    A row's first episode is its valid steps up to and including its first ``done`` (all of them
    when it has none: an episode the rollout cut, counted with the return it reached). Its return
    ``R`` is the undiscounted sum of its rewards, and each of its steps gets
    ``(R - mean_g(R)) / (std_g(R) + eps)`` over the row's group (Bessel-corrected std); every other
    step gets 0. Returns ``(advantage [N, T], first_episode [N, T] bool, R [N])``."""
    ended_before = (done.cumsum(1) - done.long()) > 0  # a done at an earlier step of the row
    first = valid & ~ended_before
    returns = torch.where(first, reward, 0.0).sum(1)
    grouped = returns.view(-1, group_size)
    relative = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + eps)
    return torch.where(first, relative.reshape(-1, 1), 0.0), first, returns


AdvantageFn = Callable[[TensorDict, float, float], torch.Tensor]  # (rollout, gamma, gae_lambda) -> [N, T]
# name -> estimator; a 'package.module:function' of the same signature may be given instead
ESTIMATORS: dict[str, AdvantageFn] = {"gae": rollout_gae, "vtrace": rollout_vtrace}


def advantage_estimator(spec: str) -> AdvantageFn:
    """The advantage function ``advantage_estimator`` names (checked when the config is built)."""
    if spec in ESTIMATORS:
        return ESTIMATORS[spec]
    estimator: AdvantageFn = import_spec(spec, "advantage_estimator")
    return estimator
