"""The return functions of ``shoal.algos.returns`` at the door (every tensor argument of each
refused, with its name, when its shape or dtype is wrong) and ``n_step_returns`` and
``importance_weights`` against slow reference loops. GAE, V-trace and the group-relative
advantages have their own reference tests (test_advantages.py, test_vtrace.py, test_grpo.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from shoal.algos.returns import gae, group_relative, importance_weights, n_step_returns, q_lambda_returns, vtrace

N, T = 4, 3  # rows and steps of every valid call below


def _float(*shape: int) -> torch.Tensor:
    return torch.rand(*shape)


def _flag(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) < 0.3


def _calls() -> dict[str, tuple[Callable[..., Any], dict[str, torch.Tensor], dict[str, Any]]]:
    """Each function with valid tensor arguments (name -> tensor, in order) and its keywords."""
    rollout = {
        "reward_t": _float(N, T),
        "value_t": _float(N, T + 1),
        "terminated_t": _flag(N, T),
        "truncated_t": _flag(N, T),
        "final_value_t": _float(N, T),
    }
    return {
        "gae": (gae, rollout, {"gamma": 0.9, "gae_lambda": 0.95, "valid_t": torch.ones(N, T, dtype=torch.bool)}),
        "q_lambda_returns": (
            q_lambda_returns,
            {
                "reward_t": rollout["reward_t"],
                "q_max_t": rollout["value_t"],
                "terminated_t": rollout["terminated_t"],
                "truncated_t": rollout["truncated_t"],
                "final_q_max_t": rollout["final_value_t"],
            },
            {"gamma": 0.9, "q_lambda": 0.95, "valid_t": torch.ones(N, T, dtype=torch.bool)},
        ),
        "vtrace": (
            vtrace,
            rollout | {"ratio_t": _float(N, T)},
            {"gamma": 0.9, "gae_lambda": 0.95, "valid_t": torch.ones(N, T, dtype=torch.bool)},
        ),
        "group_relative": (
            group_relative,
            {"reward_t": _float(N, T), "done_t": _flag(N, T), "valid_t": torch.ones(N, T, dtype=torch.bool)},
            {"group_size": 2},
        ),
        "n_step_returns": (
            n_step_returns,
            {"reward_t": _float(N, T), "terminated_t": _flag(N, T), "truncated_t": _flag(N, T)},
            {"gamma": 0.9, "valid_t": torch.ones(N, T, dtype=torch.bool)},
        ),
        "importance_weights": (importance_weights, {"prob_i": _float(N)}, {"size": N, "beta": 0.4}),
    }


def _arguments() -> list[tuple[str, str]]:
    """(function, tensor argument) for every tensor argument of every function, keywords included."""
    out = []
    for fn, (_, tensors, keywords) in _calls().items():
        out += [(fn, name) for name in tensors]
        out += [(fn, name) for name, value in keywords.items() if isinstance(value, torch.Tensor)]
    return out


def _call_with(fn_name: str, name: str, bad: Callable[[torch.Tensor], torch.Tensor]) -> None:
    fn, tensors, keywords = _calls()[fn_name]
    if name in tensors:
        tensors[name] = bad(tensors[name])
    else:
        keywords[name] = bad(keywords[name])
    fn(*tensors.values(), **keywords)


@pytest.mark.parametrize("fn_name", list(_calls()))
def test_the_valid_calls_run(fn_name):
    fn, tensors, keywords = _calls()[fn_name]
    fn(*tensors.values(), **keywords)


@pytest.mark.parametrize(("fn_name", "name"), _arguments())
def test_a_wrong_shape_is_refused_with_the_argument_named(fn_name, name):
    def wrong(x: torch.Tensor) -> torch.Tensor:
        if name in ("reward_t", "prob_i"):  # the shape the others are checked against: a dim more or less
            return x[0] if x.dim() == 2 else x.unsqueeze(1)
        return torch.cat([x, x[..., :1]], dim=-1)  # one more step: a shape that would broadcast wrong

    with pytest.raises(ValueError, match=rf"^{name} has shape \(.*\), expected"):
        _call_with(fn_name, name, wrong)


@pytest.mark.parametrize(("fn_name", "name"), _arguments())
def test_a_wrong_dtype_is_refused_with_the_argument_named(fn_name, name):
    def wrong(x: torch.Tensor) -> torch.Tensor:  # int rewards, float flags: never cast silently
        return x.long() if x.is_floating_point() else x.float()

    with pytest.raises(ValueError, match=rf"^{name} has dtype torch\.(int64|float32), expected"):
        _call_with(fn_name, name, wrong)


@pytest.mark.parametrize(
    ("fn_name", "name"), [(f, n) for f, n in _arguments() if n in ("value_t", "final_value_t", "ratio_t")]
)
def test_floats_of_another_precision_are_refused(fn_name, name):
    with pytest.raises(ValueError, match=rf"^{name} has dtype torch\.float64, expected torch\.float32 like reward_t"):
        _call_with(fn_name, name, lambda x: x.double())


@pytest.mark.parametrize("fn_name", ["gae", "vtrace", "group_relative", "n_step_returns"])
def test_rows_without_a_step_are_refused(fn_name):
    fn, tensors, keywords = _calls()[fn_name]
    empty = {name: x[:, : 1 if name == "value_t" else 0] for name, x in tensors.items()}
    keywords = {name: x[:, :0] if isinstance(x, torch.Tensor) else x for name, x in keywords.items()}
    with pytest.raises(ValueError, match=r"^reward_t has shape \(4, 0\), expected at least one step"):
        fn(*empty.values(), **keywords)


def slow_n_step(reward, terminated, truncated, valid, gamma):
    """Each window by hand: sum rewards from step 0 while the episode goes on and the next step is
    valid; the discount is gamma ** (steps summed), or 0 when the last one was terminal."""
    b, n = reward.shape
    out = np.zeros(b), np.zeros(b), np.zeros(b, dtype=np.int64)
    for i in range(b):
        total, discount, last = 0.0, 1.0, 0
        for k in range(n):
            if k and (terminated[i, k - 1] or truncated[i, k - 1] or not valid[i, k]):
                break
            total += discount * reward[i, k]
            discount *= gamma
            last = k
        out[0][i], out[1][i], out[2][i] = total, 0.0 if terminated[i, last] else discount, last
    return out


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("masked", [False, True])
def test_n_step_returns_match_a_slow_loop(n, masked):
    rng = np.random.default_rng(n)
    b, gamma = 300, 0.93
    reward = rng.normal(size=(b, n))
    terminated, truncated = rng.random((b, n)) < 0.15, rng.random((b, n)) < 0.15
    valid = rng.random((b, n)) < (0.7 if masked else 1.0)
    total, discount, last = n_step_returns(
        torch.tensor(reward),
        torch.tensor(terminated),
        torch.tensor(truncated),
        gamma=gamma,
        valid_t=torch.tensor(valid) if masked else None,
    )
    expected = slow_n_step(reward, terminated, truncated, valid, gamma)
    np.testing.assert_allclose(total.numpy(), expected[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(discount.numpy(), expected[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(last.numpy(), expected[2])
    assert total.dtype == discount.dtype == torch.float64 and last.dtype == torch.int64


def test_the_first_step_always_counts():
    reward = torch.tensor([[1.0, 2.0]])
    flags = torch.zeros(1, 2, dtype=torch.bool)
    total, discount, last = n_step_returns(reward, flags, flags, gamma=0.5, valid_t=torch.tensor([[False, True]]))
    assert total.item() == 2.0 and discount.item() == 0.25 and last.item() == 1


def slow_weights(prob, size, beta, min_prob):
    weights = [(size * p) ** -beta for p in prob]
    if min_prob is not None:
        weights = [w / (size * min_prob) ** -beta for w in weights]
    return np.array(weights)


@pytest.mark.parametrize("normalized", [False, True])
def test_importance_weights_match_a_slow_loop(normalized):
    rng = np.random.default_rng(0)
    priority = rng.random(50) + 0.01
    prob = priority / priority.sum()
    drawn = prob[rng.integers(0, 50, size=64)]
    min_prob = prob.min() if normalized else None
    weights = importance_weights(torch.tensor(drawn), size=50, beta=0.6, min_prob=min_prob)
    assert weights.dtype == torch.float32
    np.testing.assert_allclose(weights.numpy(), slow_weights(drawn, 50, 0.6, min_prob), rtol=1e-6)
    if normalized:
        assert float(weights.max()) <= 1.0 + 1e-6
    with pytest.raises(ValueError, match="size=0 must be at least 1"):
        importance_weights(torch.tensor(drawn), size=0, beta=0.6)
