"""Property-based tests (hypothesis) of the math a training run rests on.

1. Advantages: every estimator in ``shoal.algos.on_policy.ESTIMATORS`` against the slow per-row loops of
   tests/test_advantages.py, on any shape, any termination / truncation pattern, gamma and lambda
   in [0, 1], in float32 and float64.
2. Minibatches: each epoch of ``FlatSampler`` is a permutation of the kept transitions split into
   the intended number of near-equal minibatches, and a seed fixes the order.

The hypothesis profile (derandomized in CI) is chosen in tests/conftest.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from tensordict import TensorDict
from test_advantages import slow_folded_gae, slow_gae

from shoal.algos.on_policy import ESTIMATORS, rollout_gae
from shoal.algos.returns import gae
from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.buffers.samplers import num_minibatches
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec

# torch is in every example: no per-example deadline (a first call may compile or allocate)
TORCH = settings(deadline=None)
pytestmark = pytest.mark.usefixtures("no_flush_denormal")


# ----- 1. advantages ------------------------------------------------------------------------

DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


@st.composite
def gae_cases(draw, masked: bool = False) -> dict[str, Any]:
    """Rows x steps of rewards, values and flags. Flag arrays are mostly one fill value with a few
    others drawn in, so rows without a done, several episodes in a row, dones on the last step and
    steps both terminated and truncated (terminated wins) all come up."""
    n, t = draw(st.integers(1, 5)), draw(st.integers(1, 20))
    dtype = draw(st.sampled_from(list(DTYPES)))
    finite = st.floats(-100, 100, allow_nan=False, allow_infinity=False)

    def floats(shape):
        # rounded to the tested dtype first, so the float64 reference starts from the same numbers
        return draw(arrays(np.float64, shape, elements=finite)).astype(DTYPES[dtype]).astype(np.float64)

    flags = draw(arrays(np.int8, (n, t), elements=st.integers(0, 3)))  # bit 0 terminated, bit 1 truncated
    case = dict(
        reward=floats((n, t)),
        value=floats((n, t + 1)),
        terminated=(flags & 1) > 0,
        truncated=(flags & 2) > 0,
        final_value=floats((n, t)),
        gamma=draw(st.floats(0, 1)),
        lam=draw(st.floats(0, 1)),
        dtype=dtype,
    )
    case["valid"] = draw(arrays(np.bool_, (n, t))) if masked else None
    return case


def pattern_case(dtype: torch.dtype, masked: bool = False) -> dict[str, Any]:
    """Episode ends that are easy to get wrong, tried first whatever hypothesis draws: row 0 terminates,
    truncates, does both on one step and truncates on the last step; row 1 truncates every step
    (one-step episodes in a row); row 2 never ends (bootstraps from the tail value)."""
    flags = np.array([[1, 0, 2, 3, 2], [2, 2, 2, 2, 2], [0, 0, 0, 0, 0]])
    n, t = flags.shape
    return dict(
        reward=np.arange(n * t, dtype=float).reshape(n, t) - 4.0,
        value=np.linspace(-2.0, 3.0, n * (t + 1)).reshape(n, t + 1),
        terminated=(flags & 1) > 0,
        truncated=(flags & 2) > 0,
        final_value=np.full((n, t), 10.0) + np.arange(t),
        gamma=0.9,
        lam=0.75,
        dtype=dtype,
        valid=np.array([[1, 0, 1, 0, 0], [0, 1, 1, 0, 1], [1, 1, 1, 1, 1]], bool) if masked else None,
    )


def run_gae(case: dict[str, Any], valid: np.ndarray | None = None) -> torch.Tensor:
    def f(key):
        return torch.tensor(case[key], dtype=case["dtype"])

    return gae(
        f("reward"),
        f("value"),
        torch.tensor(case["terminated"]),
        torch.tensor(case["truncated"]),
        f("final_value"),
        gamma=case["gamma"],
        gae_lambda=case["lam"],
        valid_t=None if valid is None else torch.tensor(valid),
    )


def reference(case: dict[str, Any], valid: np.ndarray | None = None) -> np.ndarray:
    args = [case[k] for k in ("reward", "value", "terminated", "truncated", "final_value")]
    if valid is None:
        return slow_gae(*args, case["gamma"], case["lam"])
    return slow_folded_gae(*args, valid, case["gamma"], case["lam"])


def assert_close(got: torch.Tensor, expected: np.ndarray, case: dict[str, Any]) -> None:
    """Within rounding: each step's error is a few ulps of the inputs' magnitude, and a backward
    scan over T steps sums up to T of them on values up to T times that magnitude."""
    assert got.dtype == case["dtype"] and got.shape == expected.shape
    eps = torch.finfo(case["dtype"]).eps
    scale = max(1.0, *(float(np.abs(case[k]).max()) for k in ("reward", "value", "final_value")))
    t = expected.shape[1]
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=0, atol=8 * eps * scale * (t + 1) ** 2)


@TORCH
@given(gae_cases())
@example(pattern_case(torch.float32))
@example(pattern_case(torch.float64))
def test_gae_matches_the_reference_loop(case):
    assert_close(run_gae(case), reference(case), case)


@TORCH
@given(gae_cases(masked=True))
@example(pattern_case(torch.float32, masked=True))
@example(pattern_case(torch.float64, masked=True))
def test_folded_gae_matches_the_reference_loop(case):
    """Non-decision steps folded into the decision before them; 0 at non-decision steps."""
    got = run_gae(case, case["valid"])
    assert_close(got, reference(case, case["valid"]), case)
    assert (got.numpy()[~case["valid"]] == 0).all()


@TORCH
@given(gae_cases())
def test_an_all_valid_mask_is_bit_for_bit_no_mask(case):
    everything = np.ones_like(case["terminated"])
    assert torch.equal(run_gae(case, everything), run_gae(case))


@given(gae_cases())
def test_the_two_reference_loops_agree_when_every_step_is_a_decision(case):
    everything = np.ones_like(case["terminated"])
    np.testing.assert_allclose(reference(case, everything), reference(case), rtol=1e-12, atol=1e-9)


@TORCH
@given(gae_cases(masked=True), st.booleans(), st.data())
def test_the_rollout_estimators_read_the_first_t_steps_and_ignore_the_padding_slot(case, all_valid, data):
    """``ESTIMATORS`` (what ``advantage_estimator`` names) on a ``[N, T+1]`` rollout: the reference
    of its first T steps, whatever the padding slot holds."""
    n, t = case["reward"].shape
    valid = np.ones((n, t), bool) if all_valid else case["valid"]
    junk = data.draw(arrays(np.float64, (n, 4), elements=st.floats(-1e3, 1e3)))
    junk_flags = data.draw(arrays(np.bool_, (n, 4)))

    def padded(x, pad):
        return torch.tensor(np.concatenate([x, pad[:, None]], axis=1))

    rollout = TensorDict(
        {
            "reward": padded(case["reward"], junk[:, 0]).to(case["dtype"]),
            "value": torch.tensor(case["value"], dtype=case["dtype"]),
            "final_value": padded(case["final_value"], junk[:, 1]).to(case["dtype"]),
            "terminated": padded(case["terminated"], junk_flags[:, 0]),
            "truncated": padded(case["truncated"], junk_flags[:, 1]),
            "valid": padded(valid, junk_flags[:, 2]),
            "ratio": padded(np.ones((n, t)), junk[:, 2]).to(case["dtype"]),  # V-trace's, on-policy
        },
        batch_size=[n, t + 1],
    )
    expected = reference(case, None if all_valid else valid)
    assert set(ESTIMATORS) == {"gae", "vtrace"}  # a new estimator needs its reference here; V-trace at ratio 1 is GAE
    for name, estimator in ESTIMATORS.items():
        note(f"estimator {name}")
        assert_close(estimator(rollout, case["gamma"], case["lam"]), expected, case)
    assert ESTIMATORS["gae"] is rollout_gae


# ----- 2. minibatches -----------------------------------------------------------------------


def divisors(k: int) -> list[int]:
    return [d for d in range(1, k + 1) if k % d == 0]


def numbered(n: int, t: int) -> TensorDict:
    """An ``[n, t]`` transition view whose field ``id`` is each transition's flat index."""
    return TensorDict({"id": torch.arange(n * t).reshape(n, t)}, batch_size=[n, t])


def check_epoch(batches: list[torch.Tensor], kept: torch.Tensor, minibatch_size: int) -> None:
    m = len(kept)
    count = max(1, round(m / minibatch_size))  # the nearest number of minibatches, at least one
    sizes = [len(b) for b in batches]
    assert len(batches) == count
    assert sorted(torch.cat(batches).tolist()) == sorted(kept.tolist())  # every transition exactly once
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # near-equal, larger first
    if m and m % minibatch_size == 0:
        assert sizes == [minibatch_size] * (m // minibatch_size)
    if count == 1:
        assert torch.equal(batches[0], kept)  # one minibatch is the whole batch, unshuffled


@given(
    n=st.integers(1, 8),
    t=st.integers(1, 12),
    minibatch_size=st.integers(1, 130),
    epochs=st.integers(1, 4),
    seed=st.integers(0, 2**63 - 1),
    data=st.data(),
)
def test_each_epoch_is_a_permutation_split_into_near_equal_minibatches(n, t, minibatch_size, epochs, seed, data):
    select = data.draw(st.none() | arrays(np.bool_, (n, t)), label="select")
    steps = numbered(n, t)
    mask = None if select is None else torch.tensor(select)
    kept = steps["id"].reshape(-1) if mask is None else steps["id"][mask]
    sampler = FlatSampler(steps, minibatch_size, torch.Generator().manual_seed(seed), mask)
    assert torch.equal(sampler.data["id"], kept)  # the kept transitions, row-major
    assert len(sampler) == num_minibatches(len(kept), minibatch_size)
    replay = FlatSampler(steps, minibatch_size, torch.Generator().manual_seed(seed), mask)
    for _ in range(epochs):
        batches = [mb["id"] for mb in sampler]
        check_epoch(batches, kept, minibatch_size)
        # the same seed gives the same minibatches, epoch after epoch
        assert all(torch.equal(a, b["id"]) for a, b in zip(batches, replay, strict=True))


@given(
    n=st.integers(2, 6),
    t=st.integers(6, 12),
    minibatch_size=st.integers(1, 4),
    seeds=st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2, unique=True),
)
def test_another_seed_gives_another_order(n, t, minibatch_size, seeds):
    # at least 12 transitions in 3+ minibatches: two seeds agree by chance with probability < 1/12!
    orders = [
        torch.cat([mb["id"] for mb in FlatSampler(numbered(n, t), minibatch_size, torch.Generator().manual_seed(s))])
        for s in seeds
    ]
    assert not torch.equal(*orders)


@st.composite
def batch_shapes(draw) -> dict[str, int]:
    """num_envs, rollout_fragment_length and a sgd_minibatch_size dividing their product, as the
    config requires of one policy."""
    n, frag = draw(st.integers(1, 8)), draw(st.integers(1, 16))
    return dict(num_envs=n, rollout_fragment_length=frag, sgd_minibatch_size=draw(st.sampled_from(divisors(n * frag))))


@given(batch_shapes(), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_a_config_the_schema_accepts_gets_exactly_its_minibatches_from_a_rollout_buffer(shape, epochs, seed):
    config = PPOConfig.build(**shape, num_sgd_iter=epochs, seed=seed)
    config.check_batch()
    n, frag, mb = shape["num_envs"], shape["rollout_fragment_length"], shape["sgd_minibatch_size"]
    env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (2,))), action_spec(gym.spaces.Discrete(2)), n, 1)
    buffer = RolloutBuffer(env, config.rollout_fragment_length, {"id": ((), torch.long)})
    rollout = buffer.start_rollout()
    assert rollout.batch_size == (n, frag + 1)
    rollout["id"][:, :-1] = torch.arange(n * frag).reshape(n, frag)
    rollout["id"][:, -1] = -1  # the padding slot never reaches a minibatch
    buffer.add(rollout)
    assert torch.equal(buffer.get()["id"], torch.arange(n * frag))  # row-major: row r, step s is r * T + s
    sampler = FlatSampler(transition_view(rollout), config.sgd_minibatch_size, torch.Generator().manual_seed(seed))
    for _ in range(config.num_sgd_iter):
        batches = [b["id"] for b in sampler]
        assert [len(b) for b in batches] == [mb] * (config.train_batch_size // mb)
        check_epoch(batches, torch.arange(n * frag), mb)
