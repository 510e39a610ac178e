"""V-trace-adjusted advantages against slow loops that sum IMPALA's definition term by term, with
terminated and truncated steps everywhere, importance ratios on both sides of the clips and
non-decision steps folded in; and the on-policy cases that must give GAE and n-step returns."""

import itertools
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from shoal.algos.on_policy import ESTIMATORS
from shoal.algos.returns import gae, vtrace
from tests.conftest import folded_decisions

# (gamma, lambda, rho_clip, c_clip): the defaults; clips on either side of 1; clips above every
# ratio drawn (plain importance sampling); lambda 0 (one-step, only rho matters)
SETTINGS = [(0.99, 0.95, 1.0, 1.0), (0.9, 0.8, 2.0, 0.5), (1.0, 1.0, 5.0, 5.0), (0.97, 0.0, 0.5, 1.0)]


def one_step_target(reward, value, terminated, truncated, final_value, i, s, gamma):
    """``r + gamma * V(next)`` of step s of row i, with no bootstrap after a terminal step."""
    if terminated[i, s]:
        return reward[i, s]
    next_v = final_value[i, s] if truncated[i, s] else value[i, s + 1]
    return reward[i, s] + gamma * next_v


def impala_sum(deltas, ratios, cuts, gamma, lam, rho_clip, c_clip):
    """``sum_k gamma^(k-s) (c_s ... c_(k-1)) rho_k delta_k`` for each start s of one episode-cut
    list of steps: the paper's definition of ``v_s - V(x_s)`` written out, not a recursion."""
    out = np.zeros(len(deltas))
    for s in range(len(deltas)):
        total, weight = 0.0, 1.0
        for k in range(s, len(deltas)):
            total += weight * min(rho_clip, ratios[k]) * deltas[k]
            if cuts[k]:
                break
            weight *= gamma * lam * min(c_clip, ratios[k])
        out[s] = total
    return out


def slow_vtrace(reward, value, terminated, truncated, final_value, ratio, gamma, lam, rho_clip, c_clip):
    n, t = reward.shape
    adv = np.zeros((n, t))
    for i in range(n):
        deltas = [
            one_step_target(reward, value, terminated, truncated, final_value, i, s, gamma) - value[i, s]
            for s in range(t)
        ]
        cuts = [bool(terminated[i, s] or truncated[i, s]) for s in range(t)]
        adv[i] = impala_sum(deltas, ratio[i], cuts, gamma, lam, rho_clip, c_clip)
    return adv


def slow_folded_vtrace(reward, value, terminated, truncated, final_value, ratio, valid, gamma, lam, rho_clip, c_clip):
    """Each row's decisions listed explicitly, each with the rewards of the non-decision steps
    after it (up to the next decision, a done or the rollout's end) added undiscounted, then
    IMPALA's sum over that list with the decisions' ratios. Non-decision steps get 0."""
    n, t = reward.shape
    adv = np.zeros((n, t))
    for i in range(n):
        steps, deltas, ratios, cuts = [], [], [], []
        for d, total, next_v, cut in folded_decisions(i, reward, value, terminated, truncated, final_value, valid):
            steps.append(d)
            deltas.append(total + gamma * next_v - value[i, d])
            ratios.append(ratio[i, d])
            cuts.append(cut)
        adv[i, steps] = impala_sum(deltas, ratios, cuts, gamma, lam, rho_clip, c_clip)
    return adv


def random_case(rng, n, t, masked=False):
    """Rewards, values, dones of both kinds (and both at once) at any position, ratios
    log-uniform in [0.2, 5], and with ``masked`` decision densities from none to all."""
    reward = rng.normal(size=(n, t))
    value = rng.normal(size=(n, t + 1))
    final_value = rng.normal(size=(n, t))
    terminated, truncated = rng.random((n, t)) < 0.15, rng.random((n, t)) < 0.15
    ratio = np.exp(rng.uniform(math.log(0.2), math.log(5.0), size=(n, t)))
    valid = rng.random((n, t)) < rng.choice([0.0, 0.2, 0.5, 0.8, 1.0], size=(n, 1)) if masked else None
    return dict(
        reward=reward,
        value=value,
        terminated=terminated,
        truncated=truncated,
        final_value=final_value,
        ratio=ratio,
        valid=valid,
    )


def run_vtrace(case, gamma, lam, rho_clip=1.0, c_clip=1.0, dtype=torch.float64, ratio=None):
    def f(key):
        return torch.tensor(case[key], dtype=dtype)

    return vtrace(
        f("reward"),
        f("value"),
        torch.tensor(case["terminated"]),
        torch.tensor(case["truncated"]),
        f("final_value"),
        f("ratio") if ratio is None else ratio,
        gamma=gamma,
        gae_lambda=lam,
        rho_clip=rho_clip,
        c_clip=c_clip,
        valid_t=None if case["valid"] is None else torch.tensor(case["valid"]),
    )


def run_gae(case, gamma, lam, dtype=torch.float64):
    def f(key):
        return torch.tensor(case[key], dtype=dtype)

    return gae(
        f("reward"),
        f("value"),
        torch.tensor(case["terminated"]),
        torch.tensor(case["truncated"]),
        f("final_value"),
        gamma=gamma,
        gae_lambda=lam,
        valid_t=None if case["valid"] is None else torch.tensor(case["valid"]),
    )


def reference(case, gamma, lam, rho_clip, c_clip):
    args = [case[k] for k in ("reward", "value", "terminated", "truncated", "final_value", "ratio")]
    if case["valid"] is None:
        return slow_vtrace(*args, gamma, lam, rho_clip, c_clip)
    return slow_folded_vtrace(*args, case["valid"], gamma, lam, rho_clip, c_clip)


@pytest.mark.parametrize("gamma,lam,rho_clip,c_clip", SETTINGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vtrace_matches_reference_loop(gamma, lam, rho_clip, c_clip, dtype):
    case = random_case(np.random.default_rng(0), 48, 17)
    got = run_vtrace(case, gamma, lam, rho_clip, c_clip, dtype)
    assert got.dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(got.numpy(), reference(case, gamma, lam, rho_clip, c_clip), rtol=tol, atol=tol)


@pytest.mark.parametrize("gamma,lam,rho_clip,c_clip", SETTINGS)
@pytest.mark.parametrize("t", [1, 2, 9, 33])
def test_folded_vtrace_matches_reference_loop(gamma, lam, rho_clip, c_clip, t):
    case = random_case(np.random.default_rng(t), 100, t, masked=True)
    valid, terminated, truncated = case["valid"], case["terminated"], case["truncated"]
    # the cases this test is for do occur: rows without a decision, dones of both kinds on folded steps
    assert (~valid).all(axis=1).any() and (terminated & ~valid).any() and (truncated & ~valid).any()
    got = run_vtrace(case, gamma, lam, rho_clip, c_clip)
    np.testing.assert_allclose(got.numpy(), reference(case, gamma, lam, rho_clip, c_clip), rtol=1e-10, atol=1e-10)
    assert (got.numpy()[~valid] == 0).all()


def test_folded_vtrace_every_flag_pattern_on_short_rows():
    """Every valid / terminated / truncated combination of a 4-step row, so every fold, cut and
    tail case appears, with a ratio on each side of the clips."""
    t = 4
    patterns = np.array(list(itertools.product(range(8), repeat=t)))  # one bit each: valid, terminated, truncated
    n = len(patterns)
    rng = np.random.default_rng(1)
    case = random_case(rng, n, t)
    case.update(valid=(patterns & 1) > 0, terminated=(patterns & 2) > 0, truncated=(patterns & 4) > 0)
    got = run_vtrace(case, 0.97, 0.9, 1.5, 0.8)
    np.testing.assert_allclose(got.numpy(), reference(case, 0.97, 0.9, 1.5, 0.8), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.8, 0.7)])
def test_ratio_one_is_gae(dtype, gamma, lam):
    """On-policy data: V-trace is GAE with the same lambda, bit for bit without a mask."""
    rng = np.random.default_rng(3)
    case = random_case(rng, 64, 21)
    ones = torch.ones(64, 21, dtype=dtype)
    assert torch.equal(run_vtrace(case, gamma, lam, 2.0, 1.5, dtype, ratio=ones), run_gae(case, gamma, lam, dtype))
    folded = random_case(rng, 64, 21, masked=True)
    torch.testing.assert_close(
        run_vtrace(folded, gamma, lam, 2.0, 1.5, dtype, ratio=ones),
        run_gae(folded, gamma, lam, dtype),
        rtol=1e-6,
        atol=1e-6,
    )


def test_ratios_above_the_clips_count_as_the_clips():
    rng = np.random.default_rng(4)
    case, folded = random_case(rng, 32, 15), random_case(rng, 32, 15, masked=True)
    high = torch.tensor(case["ratio"]) + 1.0  # every ratio above 1, the default clips
    assert torch.equal(run_vtrace(case, 0.99, 0.95, ratio=high), run_gae(case, 0.99, 0.95))
    torch.testing.assert_close(run_vtrace(folded, 0.99, 0.95, ratio=high), run_gae(folded, 0.99, 0.95))


def test_on_policy_lambda_one_is_the_discounted_return_bootstrapped_at_the_end():
    """The paper's remark: with pi = mu and lambda 1, ``v_s`` is the n-step return. Summed forward
    from each start to the episode's end or the rollout's tail value."""
    rng = np.random.default_rng(5)
    case = random_case(rng, 32, 19)
    reward, value, final_value = case["reward"], case["value"], case["final_value"]
    terminated, truncated = case["terminated"], case["truncated"]
    gamma = 0.95
    n, t = reward.shape
    returns = np.zeros((n, t))
    for i, s in itertools.product(range(n), range(t)):
        total, discount, k = 0.0, 1.0, s
        while True:
            total += discount * reward[i, k]
            discount *= gamma
            if terminated[i, k]:
                break
            if truncated[i, k]:
                total += discount * final_value[i, k]
                break
            if k == t - 1:
                total += discount * value[i, t]
                break
            k += 1
        returns[i, s] = total
    got = run_vtrace(case, gamma, 1.0, ratio=torch.ones(n, t, dtype=torch.float64))
    np.testing.assert_allclose((got + torch.tensor(value[:, :-1])).numpy(), returns, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("masked", [False, True])
def test_bptt_segments_bootstrap_from_the_stored_next_value(masked):
    """Rows cut into K segments of H steps: each segment is its own row, whose value window ends
    with the stored value of the step after it, and matches the reference run on that segment alone."""
    n, k, h = 6, 4, 8
    case = random_case(np.random.default_rng(6), n, k * h, masked=masked)
    gamma, lam, rho_clip, c_clip = 0.97, 0.9, 1.5, 0.9
    windows = torch.tensor(case["value"]).unfold(1, h + 1, h).reshape(n * k, h + 1)
    per_step = {
        key: None if x is None else torch.tensor(x).reshape(n * k, h) for key, x in case.items() if key != "value"
    }

    def on_segments(lam):
        fields = (per_step[key] for key in ("terminated", "truncated", "final_value", "ratio"))
        clips = {"rho_clip": rho_clip, "c_clip": c_clip}
        adv = vtrace(
            per_step["reward"], windows, *fields, gamma=gamma, gae_lambda=lam, **clips, valid_t=per_step["valid"]
        )
        return adv.reshape(n, k * h)

    expected = np.zeros((n, k * h))
    for j in range(k):
        steps = slice(j * h, (j + 1) * h)
        segment = {key: None if x is None else x[:, steps] for key, x in case.items() if key != "value"}
        segment["value"] = case["value"][:, j * h : (j + 1) * h + 1]  # ends with the step after the segment
        expected[:, steps] = reference(segment, gamma, lam, rho_clip, c_clip)
    np.testing.assert_allclose(on_segments(lam).numpy(), expected, rtol=1e-10, atol=1e-10)
    if not masked:  # one-step targets never cross a segment end, so cutting the rows changes nothing
        torch.testing.assert_close(on_segments(0.0), run_vtrace(case, gamma, 0.0, rho_clip, c_clip), rtol=0, atol=1e-12)


def test_ratios_at_non_decision_steps_are_not_read():
    case = random_case(np.random.default_rng(7), 32, 12, masked=True)
    ratio = torch.tensor(case["ratio"]).masked_fill(~torch.tensor(case["valid"]), float("nan"))
    torch.testing.assert_close(run_vtrace(case, 0.99, 0.95, ratio=ratio), run_vtrace(case, 0.99, 0.95))


@pytest.mark.parametrize("all_valid", [False, True])
def test_the_vtrace_estimator_reads_the_first_t_steps(all_valid):
    n, t = 8, 10
    case = random_case(np.random.default_rng(8), n, t, masked=True)
    if all_valid:
        case["valid"] = None
    valid = np.ones((n, t), bool) if all_valid else case["valid"]

    def padded(x):  # the [N, T+1] slot after the last step holds junk
        return torch.tensor(np.concatenate([x, x[:, :1]], axis=1))

    rollout = TensorDict(
        {
            "reward": padded(case["reward"]),
            "value": torch.tensor(case["value"]),
            "final_value": padded(case["final_value"]),
            "terminated": padded(case["terminated"]),
            "truncated": padded(case["truncated"]),
            "valid": padded(valid),
            "ratio": padded(case["ratio"]),
        },
        batch_size=[n, t + 1],
    )
    # before any update the policy is the one that collected the rollout: every ratio is 1, so GAE's
    # advantages (the segment learner recomputes them with the current ratios for each minibatch)
    ones = torch.ones(n, t, dtype=torch.float64)
    estimate = ESTIMATORS["vtrace"](rollout, 0.9, 0.8)
    torch.testing.assert_close(estimate, run_vtrace(case, 0.9, 0.8, 1.0, 1.0, ratio=ones))
    assert torch.equal(estimate, run_gae(case, 0.9, 0.8))


def test_vtrace_rejects_bad_shapes_and_clips():
    r = torch.zeros(2, 3)
    args = (r.bool(), r.bool(), r)
    with pytest.raises(ValueError, match=r"value_t has shape \(2, 3\), expected \(2, 4\)"):
        vtrace(r, torch.zeros(2, 3), *args, r, gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match=r"ratio_t has shape \(2, 4\), expected \(2, 3\)"):
        vtrace(r, torch.zeros(2, 4), *args, torch.ones(2, 4), gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match="valid_t has shape"):
        vtrace(r, torch.zeros(2, 4), *args, r, gamma=0.9, gae_lambda=0.9, valid_t=torch.ones(3, 3, dtype=torch.bool))
    for name, bad in itertools.product(("rho_clip", "c_clip"), (0.0, -1.0, float("nan"))):
        with pytest.raises(ValueError, match=f"{name}={bad}"):
            vtrace(r, torch.zeros(2, 4), *args, r, gamma=0.9, gae_lambda=0.9, **{name: bad})
