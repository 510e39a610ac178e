"""Return math as pure functions: tensors in, tensors out, no hidden state.

Every function takes its tensors first and everything else by keyword, names them by the time
step they belong to (``reward_t``, ``value_t``, ...), and checks shapes and dtypes at the door: a
wrong shape would broadcast into the wrong rows, and a wrong dtype (int rewards, float flags)
would be cast without a word, so both raise ValueError naming the argument. Each is checked
against a slow reference loop in tests/test_returns.py, tests/test_advantages.py,
tests/test_vtrace.py and tests/test_grpo.py.
"""

from __future__ import annotations

import torch

__all__ = ["gae", "group_relative", "importance_weights", "n_step_returns", "q_lambda_returns", "vtrace"]


def gae(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    *,
    gamma: float,
    gae_lambda: float,
    valid_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438), batched over rows.

    Args:
      reward_t: ``[N, T]`` float, the reward of the transition taken at step t.
      value_t: ``[N, T+1]`` float, the value of the observation at step t; ``value_t[:, T]``
        bootstraps the tail.
      terminated_t: ``[N, T]`` bool, the episode ended in a terminal state at t: no bootstrap.
      truncated_t: ``[N, T]`` bool, the episode was cut at t (time limit): bootstrap from
        ``final_value_t``, the value of the true final observation, since ``value_t[:, t+1]`` is the
        next episode's.
      final_value_t: ``[N, T]`` float, see above; read only where ``truncated_t``.
      gamma: the discount.
      gae_lambda: the GAE trace decay lambda.
      valid_t: ``[N, T]`` bool, the row took a real decision at t; None means every step is one.
        A non-decision step (padding of a dead agent, the opponent's turn, a next-step reset) is
        not a time step of its row: its reward is added undiscounted to the row's previous
        decision in the rollout, and its done flag ends that decision's episode (terminated: no
        bootstrap; truncated: bootstrap from its ``final_value_t``). Steps after a done are the
        next episode's and never fold back across it. A decision bootstraps from the value at the
        row's next decision, or from ``value_t[:, T]`` when none follows in the rollout. Leading
        non-decision steps belong to a decision of the previous rollout and are dropped.
    The float tensors share one dtype, which the result has.

    Returns:
      ``[N, T]`` advantages, 0 at non-decision steps (every loss masks them out). The recursion is
      cut at every done (terminated or truncated) step.
    """
    _check_rollout(reward_t, value_t, terminated_t, truncated_t, final_value_t, valid_t=valid_t)
    if valid_t is None:
        delta = _td_error(reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma)
        # in the values' dtype: a float32 mask would round gamma * lambda to float32 for float64 values
        carry = gamma * gae_lambda * (~(terminated_t | truncated_t)).to(value_t.dtype)
        return _backward_scan(delta, carry)
    delta, carry = _folded_terms(
        reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma, gae_lambda, valid_t
    )
    return _backward_scan(delta, carry).masked_fill_(~valid_t, 0.0)


def q_lambda_returns(
    reward_t: torch.Tensor,
    q_max_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_q_max_t: torch.Tensor,
    *,
    gamma: float,
    q_lambda: float,
    valid_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Q(lambda) returns over a rollout (Peng's form, as PQN learns from, Gallici et al. 2025):

        G_t = r_t + gamma * ((1 - lambda) * max_a Q(s_t+1, a) + lambda * G_t+1)

    cut at every done: a terminated step's return is its reward, a truncated step's bootstraps
    from ``final_q_max_t`` (the greedy value of the episode's true last observation); the last step
    bootstraps from ``q_max_t[:, T]``. Subtracting ``max_a Q(s_t, a)`` from both sides turns the
    recursion into GAE's over the greedy values, so this is ``gae`` on them plus those values.

    Args:
      reward_t: ``[N, T]`` float, the reward of the transition taken at step t.
      q_max_t: ``[N, T+1]`` float, ``max_a Q(s_t, a)`` (over the legal actions) of the observation at step t.
      terminated_t, truncated_t, final_q_max_t, valid_t: as for ``gae``.
      gamma: the discount.
      q_lambda: the trace decay: 0 gives one-step Q-learning targets, 1 Monte Carlo returns.

    Returns:
      ``[N, T]`` returns (``q_max_t`` itself at non-decision steps, which every loss masks out).
    """
    _check_rollout(
        reward_t, q_max_t, terminated_t, truncated_t, final_q_max_t, valid_t=valid_t, names=("q_max_t", "final_q_max_t")
    )
    advantage = gae(
        reward_t,
        q_max_t,
        terminated_t,
        truncated_t,
        final_q_max_t,
        gamma=gamma,
        gae_lambda=q_lambda,
        valid_t=valid_t,
    )
    return advantage + q_max_t[:, :-1]


def vtrace(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    ratio_t: torch.Tensor,
    *,
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
      reward_t: ``[N, T]`` float, as for ``gae``.
      value_t: ``[N, T+1]`` float, as for ``gae``; rows may be bptt segments, whose last column is
        the stored value of the step after the segment: the trace ends there and bootstraps from it.
      terminated_t: ``[N, T]`` bool, as for ``gae``.
      truncated_t: ``[N, T]`` bool, as for ``gae``.
      final_value_t: ``[N, T]`` float, as for ``gae``.
      ratio_t: ``[N, T]`` float, ``pi(a_t|x_t) / mu(a_t|x_t)`` under the current policy, read only
        at decisions; at a non-decision step (see ``gae``) no action was chosen, so its folded
        reward is weighted by the ratio of the decision it folds into.
      gamma: the discount.
      gae_lambda: lambda, inside c.
      rho_clip: the truncation level rho-bar of the paper, > 0.
      c_clip: the truncation level c-bar of the paper, > 0.
      valid_t: ``[N, T]`` bool, the decisions, as for ``gae``.

    Returns:
      ``[N, T]`` advantages, 0 at non-decision steps.
    """
    _check_rollout(reward_t, value_t, terminated_t, truncated_t, final_value_t, ratio_t=ratio_t, valid_t=valid_t)
    for name, clip in (("rho_clip", rho_clip), ("c_clip", c_clip)):
        if not clip > 0:  # also rejects nan
            raise ValueError(f"{name}={clip} must be > 0: it caps the importance ratio pi/mu")
    rho = ratio_t.clamp(max=rho_clip)
    not_done = (~(terminated_t | truncated_t)).to(value_t.dtype)
    # (gamma * lambda) * not_done first, as gae forms its carry, so ratios of 1 give gae bit for bit
    trace = gamma * gae_lambda * not_done * ratio_t.clamp(max=c_clip)
    if valid_t is None:
        delta = _td_error(reward_t, value_t, terminated_t, truncated_t, final_value_t, gamma)
        return _backward_scan(delta.mul_(rho), trace)
    terms = (reward_t, value_t, terminated_t, truncated_t, final_value_t)
    return _folded_vtrace(terms, gamma, rho, trace, not_done, valid_t)


def group_relative(
    reward_t: torch.Tensor, done_t: torch.Tensor, valid_t: torch.Tensor, *, group_size: int, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRPO's advantages (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300) over rows ``[N, T]`` in
    which each ``group_size`` consecutive rows form a group (envs reset from one seed).

    A row's first episode is its valid steps up to and including its first done (all of them when
    it has none: an episode the rollout cut, counted with the return it reached). Its return ``R``
    is the undiscounted sum of its rewards, and each of its steps gets ``(R - mean_g(R)) /
    (std_g(R) + eps)`` over the row's group (Bessel-corrected std); every other step gets 0.

    Args:
      reward_t: ``[N, T]`` float, the reward of the step taken at t.
      done_t: ``[N, T]`` bool, the episode ended at t (terminated or truncated).
      valid_t: ``[N, T]`` bool, the row took a real step at t (False: padding).
      group_size: rows per group, dividing ``N``.
      eps: added to each group's std.

    Returns:
      ``(advantage [N, T], first_episode [N, T] bool, R [N])``, advantage and R in ``reward_t``'s dtype.
    """
    _check_steps(reward_t, done_t=done_t, valid_t=valid_t)
    if group_size < 1 or reward_t.shape[0] % group_size:
        raise ValueError(f"group_size={group_size} must divide the {reward_t.shape[0]} rows of reward_t")
    ended_before = (done_t.cumsum(1) - done_t.long()) > 0  # a done at an earlier step of the row
    first = valid_t & ~ended_before
    returns = torch.where(first, reward_t, 0.0).sum(1)
    grouped = returns.view(-1, group_size)
    relative = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + eps)
    return torch.where(first, relative.reshape(-1, 1), 0.0), first, returns


def n_step_returns(
    reward_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    *,
    gamma: float,
    valid_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step bootstrapped returns of a batch of ``n``-step windows (Sutton & Barto 2018, ch. 7; as
    used by Rainbow, Hessel et al. 2017, arXiv:1710.02298): the learning target of step 0 of each
    window is ``R + discount * V(s_k)``, with

        R = sum_{t < k} gamma**t * reward_t,    discount = gamma**k (0 after a terminal step),

    where the ``k`` steps summed (at least one) run from step 0 up to and including the first done
    step, and stop before the first step that is not ``valid_t``. ``V(s_k)`` is the value of the
    observation after the last summed step, ``last = k - 1``: the true final observation when that
    step was truncated; after a terminated one nothing is bootstrapped.

    Args:
      reward_t: ``[B, n]`` float, the reward of the window's t-th step (step 0: the one learned from).
      terminated_t: ``[B, n]`` bool, the episode ended in a terminal state at t: the sum stops
        there and nothing is bootstrapped.
      truncated_t: ``[B, n]`` bool, the episode was cut at t (time limit): the sum stops there and
        bootstraps from the true final observation.
      gamma: the discount.
      valid_t: ``[B, n]`` bool, the window may go on through step t (a replay buffer says False at
        steps it does not hold whole: past the newest stored step, past a sequence's end, a
        truncated step whose final observation it lost); None: every step. ``valid_t[:, 0]`` is not
        read: step 0 is the transition learned from and always counts.

    Returns:
      ``(R [B], discount [B], last [B] int64)``, R and discount in ``reward_t``'s dtype.
    """
    _check_steps(reward_t, terminated_t=terminated_t, truncated_t=truncated_t, valid_t=valid_t)
    b, n = reward_t.shape
    last = torch.zeros(b, dtype=torch.long, device=reward_t.device)
    if n == 1:  # the one-step target, in a few ops: it is the common case, once per minibatch
        return reward_t[:, 0].clone(), reward_t.new_full((b,), gamma).masked_fill_(terminated_t[:, 0], 0.0), last
    total = reward_t.new_zeros(b)
    discount = reward_t.new_ones(b)
    running = torch.ones(b, dtype=torch.bool, device=reward_t.device)  # step k is summed
    # A loop over the n steps, each vectorized over the batch: n is a few steps, B hundreds.
    for k in range(n):
        if k:
            running &= ~(terminated_t[:, k - 1] | truncated_t[:, k - 1])
            if valid_t is not None:
                running &= valid_t[:, k]
            last = torch.where(running, k, last)
        total += torch.where(running, discount * reward_t[:, k], 0.0)
        discount = torch.where(running, discount * gamma, discount)
    ended = terminated_t.gather(1, last.unsqueeze(1)).squeeze(1)
    return total, torch.where(ended, 0.0, discount), last


def importance_weights(prob_i: torch.Tensor, *, size: int, beta: float, min_prob: float | None = None) -> torch.Tensor:
    """Importance-sampling weights of prioritized replay (Schaul et al. 2016, arXiv:1511.05952):
    ``w_i = (size * P(i)) ** -beta``, which undoes the bias of drawing item ``i`` with probability
    ``P(i)`` instead of ``1 / size``; with ``min_prob``, divided by the largest weight any item can
    have, ``(size * min_prob) ** -beta``, so every weight is at most 1 (the paper's normalization,
    for stability: ``(P(i) / min_prob) ** -beta``, where ``size`` cancels).

    Args:
      prob_i: ``[B]`` float, the probabilities ``P(i)`` with which the drawn items were drawn.
      size: the number of items that could have been drawn (``N`` in the paper), >= 1.
      beta: the exponent, annealed from its initial value to 1 over training.
      min_prob: the smallest probability of any item that could have been drawn; None: no
        normalization (the caller says how it scales the weights).

    Returns:
      ``[B]`` the weights, float32.
    """
    if prob_i.dim() != 1:
        raise ValueError(f"prob_i has shape {tuple(prob_i.shape)}, expected 1 dim (items)")
    _check_dtypes({"prob_i": prob_i}, {})
    if size < 1:
        raise ValueError(f"size={size} must be at least 1: the number of items that could be drawn")
    if min_prob is not None:
        return ((prob_i / min_prob) ** -beta).float()
    return ((size * prob_i) ** -beta).float()


def _check_matrix(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected 2 dims (rows, steps)")


def _check_steps(reward_t: torch.Tensor, **flags: torch.Tensor | None) -> None:
    """``reward_t`` ``[rows, steps]`` float with at least one step, and bool ``flags`` of its shape."""
    _check_matrix("reward_t", reward_t)
    if reward_t.shape[1] < 1:
        raise ValueError(f"reward_t has shape {tuple(reward_t.shape)}, expected at least one step")
    _check_dtypes({"reward_t": reward_t}, flags)
    _check_same_shape(tuple(reward_t.shape), "reward_t", **flags)


def _check_same_shape(shape: tuple[int, ...], like: str, **tensors: torch.Tensor | None) -> None:
    for name, x in tensors.items():
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape} like {like}")


def _check_dtypes(floats: dict[str, torch.Tensor], flags: dict[str, torch.Tensor | None]) -> None:
    """``floats`` are floating point and share the first one's dtype; ``flags`` are bool (None: absent)."""
    first_name, first = next(iter(floats.items()))
    if not first.is_floating_point():
        raise ValueError(f"{first_name} has dtype {first.dtype}, expected a floating point dtype")
    for name, x in floats.items():
        if x.dtype != first.dtype:
            raise ValueError(f"{name} has dtype {x.dtype}, expected {first.dtype} like {first_name}")
    for name, flag in flags.items():
        if flag is not None and flag.dtype != torch.bool:
            raise ValueError(f"{name} has dtype {flag.dtype}, expected torch.bool")


def _check_rollout(
    reward_t: torch.Tensor,
    value_t: torch.Tensor,
    terminated_t: torch.Tensor,
    truncated_t: torch.Tensor,
    final_value_t: torch.Tensor,
    *,
    ratio_t: torch.Tensor | None = None,
    valid_t: torch.Tensor | None = None,
    names: tuple[str, str] = ("value_t", "final_value_t"),
) -> None:
    """``gae``'s and ``vtrace``'s arguments: ``[N, T]`` (``value_t`` ``[N, T+1]``), one float dtype,
    bool flags; ``names``: what the caller calls ``value_t`` and ``final_value_t``."""
    _check_matrix("reward_t", reward_t)
    n, t = reward_t.shape
    if t < 1:
        raise ValueError(f"reward_t has shape {(n, t)}, expected at least one step")
    value_name, final_name = names
    if value_t.shape != (n, t + 1):
        raise ValueError(f"{value_name} has shape {tuple(value_t.shape)}, expected {(n, t + 1)} for reward_t {(n, t)}")
    _check_same_shape(
        (n, t),
        "reward_t",
        terminated_t=terminated_t,
        truncated_t=truncated_t,
        ratio_t=ratio_t,
        valid_t=valid_t,
        **{final_name: final_value_t},
    )
    floats = {"reward_t": reward_t, value_name: value_t, final_name: final_value_t}
    if ratio_t is not None:
        floats["ratio_t"] = ratio_t
    _check_dtypes(floats, {"terminated_t": terminated_t, "truncated_t": truncated_t, "valid_t": valid_t})


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


def _folded_vtrace(
    terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    gamma: float,
    rho: torch.Tensor,
    trace: torch.Tensor,
    not_done: torch.Tensor,
    valid_t: torch.Tensor,
) -> torch.Tensor:
    """``vtrace`` with non-decision steps folded in (``terms``: its first five arguments).

    Two scans: rho of a decision weights its folded one-step TD error, rewards of the steps folded
    into it included, while the trace to the next decision is weighted by its c, which one running
    sum cannot keep apart. The first scan folds: GAE at lambda 0."""
    delta, fold = _folded_terms(*terms, gamma, 0.0, valid_t)
    # At a non-decision step the first scan holds a partial sum, not a TD error; rho 0 drops it
    # (and whatever ratio the step holds, nan say, never reaches a decision).
    delta = _backward_scan(delta, fold).mul_(rho.masked_fill_(~valid_t, 0.0))
    # A non-decision step hands the next decision's x back unchanged (the decision before it holds
    # its one gamma and c), unless it is done: then the decision's episode ended there.
    carry = torch.where(valid_t, trace, not_done)
    return _backward_scan(delta, carry).masked_fill_(~valid_t, 0.0)


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
