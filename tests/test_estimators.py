"""The off-policy estimators of ``shoal.offline.estimators`` against slow reference loops on random
ragged episodes; their bias and spread over 20 seeds on a contextual bandit and a small tabular MDP
whose true value is solved from its tables; FQE against the tables' true Q; and the door checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from shoal.offline.estimators import (
    Estimate,
    direct_method,
    doubly_robust,
    fitted_q_evaluation,
    importance_sampling,
    weighted_importance_sampling,
)

F64 = torch.float64

# ---------------------------------------------------------------- slow reference loops


def slow_weights(valid, mu_lp, pi_lp, clip):
    """w[i][t] = product of the ratios of episode i up to step t; after its end, its last weight."""
    weights = []
    for i in range(len(valid)):
        row, w = [], 1.0
        for t in range(len(valid[i])):
            if valid[i][t]:
                rho = math.exp(pi_lp[i][t] - mu_lp[i][t])
                w *= rho if clip is None else min(rho, clip)
            row.append(w)
        weights.append(row)
    return weights


def slow_is(reward, valid, mu_lp, pi_lp, gamma, clip):
    w = slow_weights(valid, mu_lp, pi_lp, clip)
    return [sum(gamma**t * w[i][t] * reward[i][t] for t in range(len(w[i])) if valid[i][t]) for i in range(len(w))]


def slow_wis(reward, valid, mu_lp, pi_lp, gamma, clip):
    w = slow_weights(valid, mu_lp, pi_lp, clip)
    e, horizon = len(w), len(w[0])
    out = [0.0] * e
    for t in range(horizon):
        mean = sum(w[i][t] for i in range(e)) / e
        for i in range(e):
            if valid[i][t] and mean > 0:
                out[i] += gamma**t * w[i][t] / mean * reward[i][t]
    return out


def slow_dr(reward, valid, mu_lp, pi_lp, q, v, gamma, clip):
    w = slow_weights(valid, mu_lp, pi_lp, clip)
    out = []
    for i in range(len(w)):
        total, before = 0.0, 1.0
        for t in range(len(w[i])):
            if valid[i][t]:
                total += gamma**t * (w[i][t] * (reward[i][t] - q[i][t]) + before * v[i][t])
                before = w[i][t]
        out.append(total)
    return out


def random_episodes(e: int, t: int, seed: int, dtype: torch.dtype = F64) -> dict[str, torch.Tensor]:
    """Ragged episodes (lengths 1..t), nan in every padding slot, pi never taking some logged actions."""
    g = torch.Generator().manual_seed(seed)
    length = torch.randint(1, t + 1, (e, 1), generator=g)
    valid = torch.arange(t) < length
    mu_lp = (0.05 + 0.95 * torch.rand(e, t, generator=g, dtype=dtype)).log()
    pi_lp = (0.05 + 0.95 * torch.rand(e, t, generator=g, dtype=dtype)).log()
    pi_lp[torch.rand(e, t, generator=g) < 0.1] = -math.inf
    tensors = {
        "reward_t": torch.randn(e, t, generator=g, dtype=dtype),
        "valid_t": valid,
        "behaviour_log_prob_t": mu_lp,
        "target_log_prob_t": pi_lp,
        "q_t": torch.randn(e, t, generator=g, dtype=dtype),
        "v_t": torch.randn(e, t, generator=g, dtype=dtype),
    }
    return {k: x if k == "valid_t" else x.masked_fill(~valid, math.nan) for k, x in tensors.items()}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Every tensor here is tiny: one thread is fastest, and spares a loaded machine the threads' spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SHAPES = [(1, 1), (1, 6), (7, 1), (5, 4), (16, 9)]


@pytest.mark.parametrize(("e", "t"), SHAPES)
@pytest.mark.parametrize("clip", [None, 1.5])
def test_the_estimators_match_slow_loops(e, t, clip):
    for seed, gamma in enumerate((1.0, 0.9, 0.5)):
        x = random_episodes(e, t, seed)
        args = [x[k].tolist() for k in ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t")]
        tensors = [x[k] for k in ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t")]
        got = {
            "is": importance_sampling(*tensors, gamma=gamma, clip_ratio=clip),
            "wis": weighted_importance_sampling(*tensors, gamma=gamma, clip_ratio=clip),
            "dr": doubly_robust(*tensors, x["q_t"], x["v_t"], gamma=gamma, clip_ratio=clip),
        }
        expected = {
            "is": slow_is(*args, gamma, clip),
            "wis": slow_wis(*args, gamma, clip),
            "dr": slow_dr(*args, x["q_t"].tolist(), x["v_t"].tolist(), gamma, clip),
        }
        for name, estimate in got.items():
            np.testing.assert_allclose(estimate.per_episode.numpy(), expected[name], rtol=1e-10, atol=1e-12)
            assert estimate.value == pytest.approx(float(np.mean(expected[name])), rel=1e-10, abs=1e-12)
        assert direct_method(x["v_t"], x["valid_t"]).per_episode.tolist() == x["v_t"][:, 0].tolist()


def test_the_dtype_is_kept_and_the_standard_error_is_the_spread():
    x = random_episodes(8, 5, 0, dtype=torch.float32)
    tensors = [x[k] for k in ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t")]
    estimate = importance_sampling(*tensors, gamma=0.95)
    assert estimate.per_episode.dtype == torch.float32 and estimate.per_episode.shape == (8,)
    assert estimate.std_error == pytest.approx(float(estimate.per_episode.std()) / math.sqrt(8))
    assert Estimate(1.0, torch.ones(1)).std_error == 0.0


def test_on_policy_is_and_wis_are_the_monte_carlo_mean():
    x = random_episodes(32, 7, 1)
    gamma = 0.97
    monte_carlo = (torch.where(x["valid_t"], x["reward_t"], 0.0) * gamma ** torch.arange(7, dtype=F64)).sum(1)
    same = (x["reward_t"], x["valid_t"], x["behaviour_log_prob_t"], x["behaviour_log_prob_t"])
    for estimator in (importance_sampling, weighted_importance_sampling):
        estimate = estimator(*same, gamma=gamma)
        assert torch.equal(estimate.per_episode, monte_carlo)
        assert estimate.value == float(monte_carlo.mean())


def test_doubly_robust_without_a_model_is_importance_sampling():
    x = random_episodes(10, 6, 2)
    tensors = (x["reward_t"], x["valid_t"], x["behaviour_log_prob_t"], x["target_log_prob_t"])
    zero = torch.zeros_like(x["reward_t"])
    dr = doubly_robust(*tensors, zero, zero, gamma=0.8)
    assert torch.equal(dr.per_episode, importance_sampling(*tensors, gamma=0.8).per_episode)


# ---------------------------------------------------------------- known problems, 20 seeds each


@dataclass(frozen=True)
class Problem:
    """A tabular MDP: start distribution, transitions P[s, a, s'], termination probability after
    (s, a), mean reward R[s, a] (observed with Gaussian noise), behaviour mu and target pi [S, A]."""

    start: torch.Tensor
    p: torch.Tensor
    term: torch.Tensor
    r: torch.Tensor
    mu: torch.Tensor
    pi: torch.Tensor
    gamma: float
    noise: float


def _t(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# Three contexts, three arms, one step: termination 1 after every action (P is never used).
BANDIT = Problem(
    start=_t([0.5, 0.3, 0.2]),
    p=torch.full((3, 3, 3), 1 / 3, dtype=F64),
    term=torch.ones(3, 3, dtype=F64),
    r=_t([[1.0, 0.0, 0.5], [0.2, 1.0, 0.0], [0.0, 0.3, 1.0]]),
    mu=_t([[0.4, 0.3, 0.3], [0.3, 0.4, 0.3], [0.3, 0.3, 0.4]]),
    pi=_t([[0.7, 0.1, 0.2], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7]]),
    gamma=1.0,
    noise=0.2,
)
# Three states, two actions, ended at random (20-40% a step); probabilities in tenths, so a data set
# holding every transition in its exact proportion can be written down (test_fqe_recovers_...).
MDP = Problem(
    start=_t([0.6, 0.4, 0.0]),
    p=_t([[[0.1, 0.6, 0.3], [0.7, 0.2, 0.1]], [[0.3, 0.3, 0.4], [0.0, 0.5, 0.5]], [[0.5, 0.5, 0.0], [0.2, 0.2, 0.6]]]),
    term=_t([[0.2, 0.3], [0.3, 0.2], [0.4, 0.2]]),
    r=_t([[1.0, 0.0], [0.5, 1.5], [-1.0, 2.0]]),
    mu=_t([[0.5, 0.5], [0.6, 0.4], [0.4, 0.6]]),
    pi=_t([[0.7, 0.3], [0.4, 0.6], [0.3, 0.7]]),
    gamma=0.9,
    noise=0.3,
)
SEEDS, EPISODES = 20, 400


def true_q(problem: Problem, gamma: float | None = None) -> torch.Tensor:
    """Q of pi, [S, A]: V solves V = R_pi + gamma * M_pi V, M_pi[s, s'] = sum_a pi (1 - term) P."""
    gamma = problem.gamma if gamma is None else gamma
    go_on = (1 - problem.term).unsqueeze(-1) * problem.p
    m = torch.einsum("sa,sat->st", problem.pi, go_on)
    v = torch.linalg.solve(torch.eye(len(m), dtype=F64) - gamma * m, (problem.pi * problem.r).sum(1))
    return problem.r + gamma * go_on @ v


def true_value(problem: Problem) -> float:
    return float(problem.start @ (problem.pi * true_q(problem)).sum(1))


def simulate(problem: Problem, n: int, seed: int) -> dict[str, torch.Tensor]:
    """n episodes under mu, padded to the longest: every row steps until all have ended."""
    g = torch.Generator().manual_seed(seed)
    state = torch.multinomial(problem.start, n, replacement=True, generator=g)
    alive = torch.ones(n, dtype=torch.bool)
    steps = []
    while alive.any():
        action = torch.multinomial(problem.mu[state], 1, generator=g).squeeze(1)
        reward = problem.r[state, action] + problem.noise * torch.randn(n, generator=g, dtype=F64)
        end = torch.rand(n, generator=g, dtype=F64) < problem.term[state, action]
        next_state = torch.multinomial(problem.p[state, action], 1, generator=g).squeeze(1)
        steps.append((state, action, reward, alive, end, next_state))
        alive, state = alive & ~end, next_state
    names = ("state", "action", "reward", "valid", "end", "next_state")
    return {name: torch.stack(column, 1) for name, column in zip(names, zip(*steps))}


def fqe_from_episodes(problem: Problem, ep: dict[str, torch.Tensor]) -> torch.Tensor:
    """Tabular FQE (one-hot states, linear) on the logged steps: its Q table [S, A]."""
    valid = ep["valid"]
    s = len(problem.start)
    one_hot = torch.eye(s, dtype=F64)
    model = fitted_q_evaluation(
        one_hot[ep["state"][valid]],
        ep["action"][valid],
        ep["reward"][valid],
        one_hot[ep["next_state"][valid]],
        ep["end"][valid],
        problem.pi[ep["next_state"][valid]],
        gamma=problem.gamma,
        iterations=150,
        hidden=0,
    )
    return model(one_hot)


def run_seed(problem: Problem, seed: int) -> dict[str, float]:
    ep = simulate(problem, EPISODES, seed)
    s, a, valid = ep["state"], ep["action"], ep["valid"]
    logged = (ep["reward"], valid, problem.mu[s, a].log(), problem.pi[s, a].log())
    q = true_q(problem)
    models = {"true Q": q, "wrong Q": 0.5 * q + 1.0, "FQE": fqe_from_episodes(problem, ep)}
    out = {
        "IS": importance_sampling(*logged, gamma=problem.gamma).value,
        "IS clip 1.2": importance_sampling(*logged, gamma=problem.gamma, clip_ratio=1.2).value,
        "WIS": weighted_importance_sampling(*logged, gamma=problem.gamma).value,
    }
    for name, table in models.items():
        v = (problem.pi * table).sum(1)
        out[f"DM ({name})"] = direct_method(v[s], valid).value
        out[f"DR ({name})"] = doubly_robust(*logged, table[s, a], v[s], gamma=problem.gamma).value
    return out


def estimator_table(problem: Problem) -> dict[str, dict[str, float]]:
    """Each estimator's true value, mean estimate, bias, std over the seeds and standard error of
    the mean estimate (std / sqrt(seeds))."""
    runs = [run_seed(problem, seed) for seed in range(SEEDS)]
    truth = true_value(problem)
    table = {}
    for name in runs[0]:
        values = np.array([run[name] for run in runs])
        mean, std = float(values.mean()), float(values.std(ddof=1))
        table[name] = {"truth": truth, "mean": mean, "bias": mean - truth, "std": std, "se": std / math.sqrt(SEEDS)}
    return table


@pytest.fixture(scope="module", params=["bandit", "mdp"])
def table(request):
    return estimator_table({"bandit": BANDIT, "mdp": MDP}[request.param])


def test_the_bandit_truth_by_hand():
    # sum_x p(x) sum_a pi(a|x) r(x, a), the arms of reward 0 left out: 0.5 * 0.8 + 0.3 * 0.82 + 0.2 * 0.73
    by_hand = 0.5 * (0.7 * 1.0 + 0.2 * 0.5) + 0.3 * (0.1 * 0.2 + 0.8 * 1.0) + 0.2 * (0.1 * 0.3 + 0.7 * 1.0)
    assert by_hand == pytest.approx(0.792, abs=1e-12)
    assert true_value(BANDIT) == pytest.approx(by_hand, abs=1e-12)  # the Bellman solve agrees


@pytest.mark.parametrize("name", ["IS", "DR (true Q)", "DR (wrong Q)", "DM (true Q)"])
def test_unbiased_estimators_are_within_three_standard_errors(table, name):
    row = table[name]
    assert abs(row["bias"]) < 3 * row["se"], row


def test_wis_has_a_small_error_and_less_spread_than_is(table):
    wis, is_ = table["WIS"], table["IS"]
    assert abs(wis["bias"]) < min(3 * wis["se"], 0.03 * abs(wis["truth"])), wis
    assert math.hypot(wis["bias"], wis["std"]) < math.hypot(is_["bias"], is_["std"])


def test_dr_is_unbiased_with_a_wrong_model_where_dm_is_not(table):
    assert abs(table["DM (wrong Q)"]["bias"]) > 0.1 * abs(table["DM (wrong Q)"]["truth"])
    assert abs(table["DR (wrong Q)"]["bias"]) < 3 * table["DR (wrong Q)"]["se"]


def test_a_good_model_makes_dr_less_variable_than_is(table):
    assert table["DR (true Q)"]["std"] < 0.7 * table["IS"]["std"]  # measured: 0.38 (bandit), 0.52 (MDP)
    assert table["DR (FQE)"]["std"] < 0.7 * table["IS"]["std"]
    assert abs(table["DR (FQE)"]["bias"]) < 3 * table["DR (FQE)"]["se"] + 0.01


def test_clipping_trades_spread_for_bias(table):
    clipped = table["IS clip 1.2"]
    assert clipped["std"] < table["IS"]["std"] and abs(clipped["bias"]) > 3 * clipped["se"], clipped


# ---------------------------------------------------------------- FQE


def exact_transitions(problem: Problem) -> dict[str, torch.Tensor]:
    """100 transitions from each (s, a) in the exact proportions of the MDP's tables (tenths), at
    the mean reward: the empirical MDP is the MDP."""
    rows = []
    for s in range(3):
        for a in range(2):
            next_states = [n for n in range(3) for _ in range(round(10 * float(problem.p[s, a, n])))]
            for i in range(10):
                rows += [(s, a, i < round(10 * float(problem.term[s, a])), n) for n in next_states]
    state, action, terminated, next_state = (torch.tensor(column) for column in zip(*rows))
    one_hot = torch.eye(3, dtype=F64)
    return {
        "obs": one_hot[state],
        "action": action,
        "reward": problem.r[state, action],
        "next_obs": one_hot[next_state],
        "terminated": terminated,
        "next_action_probs": problem.pi[next_state],
    }


@pytest.mark.parametrize("hidden", [0, ()])
def test_linear_fqe_on_one_hot_states_recovers_the_true_q(hidden):
    data = exact_transitions(MDP)
    model = fitted_q_evaluation(*data.values(), gamma=MDP.gamma, iterations=300, hidden=hidden)
    torch.testing.assert_close(model(torch.eye(3, dtype=F64)), true_q(MDP), rtol=0, atol=1e-9)


def test_mlp_fqe_recovers_the_true_q():
    data = {k: x.float() if x.dtype == F64 else x for k, x in exact_transitions(MDP).items()}
    kwargs = dict(gamma=0.5, iterations=8, hidden=(32,), epochs_per_iteration=40, lr=0.05, batch_size=None)
    q = fitted_q_evaluation(*data.values(), **kwargs)(torch.eye(3))
    assert q.dtype == torch.float32
    torch.testing.assert_close(q.double(), true_q(MDP, gamma=0.5), rtol=0, atol=0.01)  # measured: 1e-3


def test_mlp_fqe_is_deterministic_and_leaves_the_global_rng_alone():
    data = exact_transitions(MDP).values()
    kwargs = dict(gamma=0.9, iterations=2, hidden=(16, 16), epochs_per_iteration=2, lr=0.01, batch_size=128)
    rng_state = torch.get_rng_state()
    first = fitted_q_evaluation(*data, **kwargs, seed=3)(torch.eye(3, dtype=F64))
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert torch.equal(fitted_q_evaluation(*data, **kwargs, seed=3)(torch.eye(3, dtype=F64)), first)
    assert not torch.equal(fitted_q_evaluation(*data, **kwargs, seed=4)(torch.eye(3, dtype=F64)), first)


# ---------------------------------------------------------------- bad input


def _valid_episode_args() -> dict[str, torch.Tensor]:
    x = random_episodes(4, 3, 0, dtype=torch.float32)
    return {k: v.nan_to_num(0.0) if k != "valid_t" else v for k, v in x.items()}


ESTIMATORS = {
    "importance_sampling": (importance_sampling, ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t")),
    "weighted_importance_sampling": (
        weighted_importance_sampling,
        ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t"),
    ),
    "doubly_robust": (
        doubly_robust,
        ("reward_t", "valid_t", "behaviour_log_prob_t", "target_log_prob_t", "q_t", "v_t"),
    ),
    "direct_method": (direct_method, ("v_t", "valid_t")),
}


def _call(fn_name: str, change: dict[str, torch.Tensor] | None = None, **keywords: Any) -> Estimate:
    fn, names = ESTIMATORS[fn_name]
    x = _valid_episode_args() | (change or {})
    if fn_name != "direct_method":
        keywords.setdefault("gamma", 0.9)
    return fn(*(x[name] for name in names), **keywords)


def _not_prefix() -> torch.Tensor:
    valid = torch.ones(4, 3, dtype=torch.bool)
    valid[1, 1] = False  # a step after a gap
    return valid


BAD_EPISODES = [
    ("importance_sampling", "target_log_prob_t", torch.zeros(4, 4), r"^target_log_prob_t has shape \(4, 4\), "),
    ("weighted_importance_sampling", "behaviour_log_prob_t", torch.zeros(3, 3), r"^behaviour_log_prob_t has shape"),
    ("doubly_robust", "q_t", torch.zeros(3, 4), r"^q_t has shape \(3, 4\), expected \(4, 3\) like reward_t$"),
    ("doubly_robust", "v_t", torch.zeros(4), r"^v_t has shape \(4,\), expected \(4, 3\) like reward_t$"),
    ("direct_method", "valid_t", torch.ones(4, 2, dtype=torch.bool), r"^valid_t has shape \(4, 2\), expected \(4, 3\)"),
    (
        "importance_sampling",
        "reward_t",
        torch.zeros(4),
        r"^reward_t has shape \(4,\), expected \[E, T\] with E, T >= 1",
    ),
    ("importance_sampling", "reward_t", torch.zeros(4, 0), r"^reward_t has shape \(4, 0\), expected \[E, T\]"),
    ("importance_sampling", "valid_t", torch.ones(4, 3), r"^valid_t has dtype torch\.float32, expected torch\.bool"),
    ("direct_method", "valid_t", torch.ones(4, 3, dtype=torch.uint8), r"^valid_t has dtype torch\.uint8, expected"),
    ("importance_sampling", "reward_t", torch.zeros(4, 3, dtype=torch.long), r"^reward_t has dtype torch\.int64, exp"),
    ("direct_method", "v_t", torch.zeros(4, 3, dtype=torch.long), r"^v_t has dtype torch\.int64, expected a floating"),
    ("doubly_robust", "q_t", torch.zeros(4, 3, dtype=F64), r"^q_t has dtype torch\.float64, expected torch\.float32 "),
    (
        "importance_sampling",
        "valid_t",
        _not_prefix(),
        r"^valid_t row 1 is not True from step 0 to its end, then False$",
    ),
    ("direct_method", "valid_t", torch.tensor([[1, 1, 0]] * 3 + [[0, 0, 0]]).bool(), r"^valid_t row 3 is not True"),
    (
        "importance_sampling",
        "behaviour_log_prob_t",
        torch.full((4, 3), -math.inf),
        r"^behaviour_log_prob_t is not finite at a valid step",
    ),
    ("doubly_robust", "target_log_prob_t", torch.full((4, 3), math.nan), r"^target_log_prob_t is nan or \+inf"),
]


@pytest.mark.parametrize(("fn_name", "name", "bad", "match"), BAD_EPISODES)
def test_bad_episodes_are_refused_with_the_argument_named(fn_name, name, bad, match):
    _call(fn_name)  # the call is valid without the change
    with pytest.raises(ValueError, match=match):
        _call(fn_name, {name: bad})


@pytest.mark.parametrize("fn_name", ["importance_sampling", "weighted_importance_sampling", "doubly_robust"])
@pytest.mark.parametrize("gamma", [1.5, -0.1, math.nan])
def test_a_discount_outside_0_1_is_refused(fn_name, gamma):
    with pytest.raises(ValueError, match=rf"^gamma={gamma} must be in \[0, 1\]: the discount$"):
        _call(fn_name, gamma=gamma)
    _call(fn_name, gamma=0.0)  # the ends are allowed
    _call(fn_name, gamma=1.0)


@pytest.mark.parametrize("clip", [0.0, -1.0, math.nan])
def test_a_clip_that_is_not_positive_is_refused(clip):
    with pytest.raises(ValueError, match=rf"^clip_ratio={clip} must be > 0 or None"):
        _call("doubly_robust", clip_ratio=clip)


BAD_TRANSITIONS = [
    ("obs", torch.zeros(600, dtype=F64), r"^obs has shape \(600,\) and dtype torch\.float64, expected \[B, D\] float"),
    ("obs", torch.zeros(600, 3, dtype=torch.long), r"^obs has shape \(600, 3\) and dtype torch\.int64, expected"),
    ("action", torch.zeros(600), r"^action has dtype torch\.float32, expected torch\.int64$"),
    ("action", torch.full((600,), 2), r"^action holds 2\.\.2, expected actions in \[0, 2\)$"),
    ("reward", torch.zeros(599, dtype=F64), r"^reward has shape \(599,\), expected \(600,\) for obs \(600, 3\)$"),
    ("next_obs", torch.zeros(600, 3), r"^next_obs has dtype torch\.float32, expected torch\.float64$"),
    ("terminated", torch.zeros(600), r"^terminated has dtype torch\.float32, expected torch\.bool$"),
    (
        "next_action_probs",
        torch.zeros(600, dtype=F64),
        r"^next_action_probs has shape \(600,\), expected \(600, A\), A >= 1$",
    ),
]


@pytest.mark.parametrize(("name", "bad", "match"), BAD_TRANSITIONS)
def test_bad_transitions_are_refused_with_the_argument_named(name, bad, match):
    data = exact_transitions(MDP) | {name: bad}
    with pytest.raises(ValueError, match=match):
        fitted_q_evaluation(*data.values(), gamma=0.9, iterations=1, hidden=0)


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        (dict(gamma=1.01), r"^gamma=1\.01 must be in \[0, 1\]"),
        (dict(iterations=0), r"^iterations=0, .*: expected integers >= 1"),
        (dict(hidden=(8, -1)), r"hidden=\(8, -1\), lr=0\.001: expected integers >= 1 \(hidden: or 0"),
        (dict(lr=0.0), r"lr=0\.0: expected .*lr > 0$"),
        (dict(batch_size=0), r"batch_size=0, "),
    ],
)
def test_bad_fqe_settings_are_refused(keywords, match):
    with pytest.raises(ValueError, match=match):
        fitted_q_evaluation(*exact_transitions(MDP).values(), **({"gamma": 0.9, "iterations": 1} | keywords))
