"""Property-based tests (hypothesis) of the pure parts a training run rests on.

1. Advantages: every estimator in ``shoal.algos.advantages`` against the slow per-row loops of
   tests/test_advantages.py, on any shape, any termination / truncation pattern, gamma and lambda
   in [0, 1], in float32 and float64.
2. Minibatches: each epoch of ``FlatSampler`` is a permutation of the kept transitions split into
   the intended number of near-equal minibatches, and a seed fixes the order.
3. Configuration: configs drawn from ``PPOConfig``'s own fields; whatever the schema accepts builds
   a trainer, and whatever it rejects (wrong type, out of range, unknown key, inconsistent keys)
   raises ``shoal.ConfigError`` naming the problem, never another exception.

The hypothesis profile (derandomized in CI) is chosen in tests/conftest.py.
"""

from __future__ import annotations

import math
import re
import string
import types
import typing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from tensordict import TensorDict

import shoal
from shoal.algos.advantages import ESTIMATORS, gae, rollout_gae
from shoal.algos.ppo import PPOAlgorithm
from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.buffers.samplers import num_minibatches
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from shoal.models.catalog import ModelConfig
from tests.test_advantages import slow_folded_gae, slow_gae

# torch is in every example: no per-example deadline (a first call may compile or allocate)
TORCH = settings(deadline=None)


@pytest.fixture(autouse=True)
def subnormal_floats():
    """Every Trainer turns on flush-to-zero for the whole process (``torch.set_flush_denormal``),
    and it stays on after the trainer is gone. Hypothesis cannot draw floats then (subnormals
    read as 0), so each test here starts without it, and ``build`` turns it off again."""
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


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
        case["gamma"],
        case["lam"],
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
        },
        batch_size=[n, t + 1],
    )
    expected = reference(case, None if all_valid else valid)
    assert set(ESTIMATORS) == {"gae"}  # a new estimator needs its reference here
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


# ----- 3. configuration ---------------------------------------------------------------------

# what the tests pass themselves (shoal.PPO(env=..., save_outputs=False, verbose=0, **config))
FIXED = {"env": "CartPole-v1", "save_outputs": False, "verbose": 0}
KEYS = PPOConfig.keys()
FIELDS = {field.alias or name: field for name, field in PPOConfig.model_fields.items()}


def non_none(annotation: Any) -> tuple[Any, bool]:
    """``(X, optional)`` for ``X | None``; other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True  # noqa: UP007 (built at run time)
    return annotation, False


def bounds(key: str) -> dict[str, Any]:
    """The numeric constraints of a field: ge / gt / le / lt as pydantic stores them."""
    out = {}
    for item in FIELDS[key].metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(item, name, None) is not None:
                out[name] = getattr(item, name)
    return out


def scalar_values(key: str) -> st.SearchStrategy | None:
    """Values of a scalar field (bool, int, float, Literal; or None for an optional one) drawn
    from its type and bounds; None for any other field."""
    kind, optional = non_none(FIELDS[key].annotation)
    b = bounds(key)
    if kind is bool:
        values = st.booleans()
    elif kind is int:
        lo = b["ge"] if "ge" in b else b["gt"] + 1 if "gt" in b else None
        # unbounded ints stop at int64: a window of 2**63 episodes overflows a C size (a deque's maxlen)
        hi = b["le"] if "le" in b else b["lt"] - 1 if "lt" in b else 2**63 - 1
        values = st.integers(lo, hi)
    elif kind is float:
        values = st.floats(
            min_value=b.get("ge", b.get("gt")),
            max_value=b.get("le", b.get("lt")),
            exclude_min="gt" in b,
            exclude_max="lt" in b,
            allow_nan=False,
            allow_infinity=False,
            allow_subnormal=False,  # see SUBNORMAL
        )
    elif typing.get_origin(kind) is typing.Literal:
        values = st.sampled_from(typing.get_args(kind))
    else:
        return None
    return st.none() | values if optional else values


# SUBNORMAL: config floats are drawn without subnormals (5e-324...). A trainer turns flush-to-zero
# on and only then builds its policies' configs, which reads a positive subnormal clip_reward as 0.
MLP_CONFIGS = st.fixed_dictionaries(
    {},
    optional={
        "hiddens": st.lists(st.integers(1, 16), min_size=1, max_size=3),
        "activation": st.sampled_from(["tanh", "relu"]),
        "shared_trunk": st.booleans(),
        "channels": st.sampled_from(["first", "last"]),  # read only for images; accepted for any
    },
)

# Fields drawn by hand, with why; every other field is drawn by `scalar_values` from the schema.
# (A new field that is neither fails test_every_config_key_is_drawn.)
BY_HAND: dict[str, st.SearchStrategy] = {
    "algo": st.sampled_from(["ppo", "PPO", PPOAlgorithm]),
    "env_config": st.just({}),  # CartPole takes no keywords worth drawing
    "vectorization_mode": st.sampled_from([None, "sync", "vector_entry_point"]),  # "async" starts processes
    "num_envs": st.integers(1, 4),  # each a real CartPole: kept small for speed
    "num_workers": st.just(0),  # worker processes: the slow tests in test_mp.py
    "async_factor": st.just(1),  # needs workers
    "torch_threads": st.integers(1, 2),  # the process's thread pool, restored after each example
    "device": st.just("cpu"),
    "name": st.none() | st.text(max_size=12),
    "run_dir": st.none() | st.text(string.ascii_letters, max_size=12),
    "wandb_project": st.none() | st.text(string.ascii_letters, max_size=12),
    "callbacks": st.just([]),
    "model": st.just("mlp"),  # 'cnn' needs images: a ConfigError on CartPole (tested below)
    "model_config": MLP_CONFIGS,
    "clip_rewards": st.none() | st.booleans() | st.floats(0, 100, exclude_min=True, allow_subnormal=False),
    "central_critic": st.just(None),  # needs a multi-agent env: a ConfigError on CartPole (tested below)
    "advantage_estimator": st.sampled_from(["gae", "shoal.algos.advantages:rollout_gae"]),
}
JOINT = {  # drawn together in `valid_configs`
    "rollout_fragment_length",
    "train_batch_size",
    "sgd_minibatch_size",
    "policies",
    "policy_mapping_fn",
    "policies_to_train",
}


def drawn(key: str) -> st.SearchStrategy:
    return BY_HAND[key] if key in BY_HAND else scalar_values(key)


def test_every_config_key_is_drawn():
    """The generator covers the whole schema: each key is a scalar drawn from its type and bounds,
    drawn by hand, drawn jointly, or passed by the tests."""
    for key in KEYS:
        assert key in BY_HAND or key in JOINT or key in FIXED or scalar_values(key) is not None, key


@st.composite
def policy_settings(draw) -> dict[str, Any]:
    """policies (a list of ids or id -> per-policy overrides), and a mapping and trained subset
    that fit CartPole's one agent, 'agent_0'."""
    ids = draw(
        st.lists(
            st.sampled_from(["agent_0", "main", "opponent", "p"]) | st.text(min_size=1, max_size=6),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["policies"] = ids
    else:
        overrides = st.fixed_dictionaries({}, optional={k: drawn(k) for k in PPOConfig.POLICY_KEYS})
        out["policies"] = {pid: draw(st.none() | overrides) for pid in ids}
    if (len(ids) > 1 and "agent_0" not in ids) or draw(st.booleans()):
        out["policy_mapping_fn"] = {"agent_0": draw(st.sampled_from(ids))}
    if draw(st.booleans()):
        out["policies_to_train"] = draw(st.lists(st.sampled_from(ids), unique=True))
    return out


@st.composite
def valid_configs(draw) -> dict[str, Any]:
    """A config the schema accepts: each key present or left to its default."""
    cfg = {key: draw(drawn(key)) for key in KEYS if key not in JOINT and key not in FIXED and draw(st.booleans())}
    n = cfg.setdefault("num_envs", 8)
    frag = draw(st.integers(1, 8))
    shape = draw(st.sampled_from(["rollout_fragment_length", "train_batch_size", "both", "default"]))
    if shape == "default":
        frag = 32
    if shape in ("rollout_fragment_length", "both"):
        cfg["rollout_fragment_length"] = frag
    if shape in ("train_batch_size", "both"):
        cfg["train_batch_size"] = n * frag
    cfg["sgd_minibatch_size"] = draw(st.sampled_from(divisors(n * frag)))
    if draw(st.booleans()):
        cfg |= draw(policy_settings())
    return cfg


def build(cfg: dict[str, Any]) -> shoal.PPO:
    """``shoal.PPO`` with ``cfg``; the process's thread count restored and flush-to-zero off again."""
    threads = torch.get_num_threads()
    try:
        return shoal.PPO(**FIXED | cfg)
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)


@settings(deadline=None, max_examples=60)
@given(valid_configs())
def test_any_config_the_schema_accepts_builds_a_trainer(cfg):
    config = PPOConfig.build(**cfg)
    with build(cfg) as trainer:
        c = trainer.config
        assert c.train_batch_size == c.num_envs * c.rollout_fragment_length
        assert trainer.algorithm.buffer.rollout.batch_size == (c.num_envs, c.rollout_fragment_length + 1)
        assert list(trainer.policies) == config.policy_ids
        trained = config.policy_ids if config.policies_to_train is None else config.policies_to_train
        assert set(trainer.algorithm.learners) == set(trained)
        for pid, learner in trainer.algorithm.learners.items():
            for key, value in ((c.policies or {}).get(pid) or {}).items():
                if key != "model_config":
                    assert getattr(learner.config, key) == value, (pid, key)
        for key, value in cfg.items():
            if scalar_values(key) is not None:  # plain values are kept as given
                assert getattr(c, key) == value, key


# ----- rejected configs: a ConfigError naming the problem, never another exception ----------

NOT_INT = ["seven", 1.5, [1], {"a": 1}]
NOT_FLOAT = ["fast", [0.1], {"a": 0.1}]
NOT_BOOL = ["maybe", 2, 0.5, [True]]
NOT_STR = [5, 1.5, [1], {"a": 1}]


def wrong_types(key: str) -> list[Any]:
    """Values no lax conversion turns into the field's type (None only for a non-optional one)."""
    kind, optional = non_none(FIELDS[key].annotation)
    if kind is Any:
        return []
    origin = typing.get_origin(kind)
    if kind in (bool, int, float, str):
        wrong = {bool: NOT_BOOL, int: NOT_INT, float: NOT_FLOAT, str: NOT_STR}[kind]
    elif origin is typing.Literal:
        wrong = ["no-such-option", 3, [1]]
    elif origin is dict:
        wrong = [5, "x", [1, 2]]
    elif origin is list:
        wrong = [5, "x", {"a": 1}]
    else:  # the unions: policies (dict or list), clip_rewards (bool or float)
        wrong = [object(), "x"]
    return wrong if optional else [*wrong, None]


TYPED = [k for k in KEYS if k not in FIXED and wrong_types(k)]
BOUNDED = [k for k in KEYS if k not in FIXED and bounds(k)]


def out_of_range(key: str) -> st.SearchStrategy:
    b, (kind, _) = bounds(key), non_none(FIELDS[key].annotation)
    step = 1 if kind is int else 1e-9
    options = []
    if "ge" in b:
        options.append(st.just(b["ge"] - step))
        options.append(
            st.integers(-(10**6), -1).map(lambda x: b["ge"] + x)
            if kind is int
            else st.floats(max_value=b["ge"], exclude_max=True, allow_nan=False, allow_subnormal=False)
        )
    if "gt" in b:
        options.append(st.just(b["gt"]))
        options.append(
            st.integers(-(10**6), 0).map(lambda x: b["gt"] + x)
            if kind is int
            else st.floats(max_value=b["gt"], allow_nan=False, allow_subnormal=False)
        )
    if "le" in b:
        options.append(st.just(b["le"] + step))
        options.append(
            st.integers(1, 10**6).map(lambda x: b["le"] + x)
            if kind is int
            else st.floats(min_value=b["le"], exclude_min=True, allow_nan=False, allow_subnormal=False)
        )
    if kind is float:
        options.append(st.just(math.nan))
    return st.one_of(options)


def typo(key: str) -> st.SearchStrategy:
    """The key with one character dropped, doubled or swapped with the next."""

    def edit(i_kind):
        i, kind = i_kind
        i %= len(key)
        if kind == 0:
            return key[:i] + key[i + 1 :]
        if kind == 1:
            return key[:i] + key[i] + key[i:]
        return key[:i] + key[i + 1 : i + 2] + key[i] + key[i + 2 :]

    return st.tuples(st.integers(0, 50), st.integers(0, 2)).map(edit).filter(lambda k: k not in KEYS and k not in FIXED)


@st.composite
def field_mistakes(draw) -> tuple[dict[str, Any], str]:
    """A valid config with one key made wrong on its own: its type, its range or its name."""
    cfg = draw(valid_configs())
    kind = draw(st.sampled_from(["type", "range", "unknown", "typo"]))
    if kind == "type":
        key = draw(st.sampled_from(TYPED))
        cfg[key] = draw(st.sampled_from(wrong_types(key)))
        return cfg, rf"bad value for '{key}': "  # the key itself, not pydantic's path into a union
    if kind == "range":
        key = draw(st.sampled_from(BOUNDED))
        cfg[key] = draw(out_of_range(key))
        return cfg, rf"bad value for '{key}'"
    if kind == "unknown":
        key = draw(
            st.text(string.ascii_lowercase + "_", min_size=1, max_size=20).filter(
                lambda k: k not in KEYS and k not in FIXED
            )
        )
        cfg[key] = draw(st.integers() | st.text(max_size=5) | st.none())
        if key in PPOConfig.MOVED:
            return cfg, rf"'{key}' is a model_config key now"
        return cfg, rf"unknown config key '{key}' for PPOConfig\..*Valid keys: "
    key = draw(st.sampled_from([k for k in KEYS if len(k) >= 5 and k not in FIXED]))
    wrong = draw(typo(key))
    cfg[wrong] = 1
    return cfg, rf"unknown config key '{wrong}' for PPOConfig\. Did you mean '"


@st.composite
def inconsistent_configs(draw) -> tuple[dict[str, Any], str]:
    """Keys each valid alone that do not fit together (or not CartPole), with what the error says."""
    small = st.integers(1, 8)
    case = draw(st.integers(0, 22))
    if case == 0:
        n, w = draw(small), draw(st.integers(2, 9))
        if n % w == 0:
            n += 1
        return {"num_envs": n, "num_workers": w}, rf"num_envs={n} must be a multiple of num_workers={w}"
    if case == 1:
        f = draw(st.integers(2, 4))
        return {"async_factor": f}, rf"async_factor={f} needs env worker processes"
    if case == 2:
        f = draw(st.integers(2, 4))
        w = draw(st.integers(1, 12).filter(lambda x: x % f))
        return {
            "num_envs": w,
            "num_workers": w,
            "async_factor": f,
        }, rf"num_workers={w} must be a multiple of async_factor={f}"
    if case == 3:
        mode = draw(st.sampled_from(["sync", "async", "vector_entry_point"]))
        return {"num_envs": 2, "num_workers": 2, "vectorization_mode": mode}, "both choose how envs are stepped"
    if case == 4:
        n = draw(st.integers(2, 8))
        batch = draw(st.integers(1, 200).filter(lambda b: b % n))
        return {"num_envs": n, "train_batch_size": batch}, rf"train_batch_size={batch} is not divisible by num_envs={n}"
    if case == 5:
        n, frag = draw(small), draw(small)
        batch = draw(st.integers(1, 100).filter(lambda b: b != n * frag))
        return {"num_envs": n, "rollout_fragment_length": frag, "train_batch_size": batch}, (
            rf"train_batch_size={batch} must equal num_envs={n} x rollout_fragment_length={frag}"
        )
    if case == 6:
        n, frag = draw(small), draw(small)
        mb = draw(st.integers(1, 100).filter(lambda m: m > n * frag or (n * frag) % m))
        return {"num_envs": n, "rollout_fragment_length": frag, "sgd_minibatch_size": mb}, (
            rf"sgd_minibatch_size={mb} must divide the {n * frag} agent steps"
        )
    if case == 7:
        return {"policies_to_train": draw(st.lists(st.text(max_size=4)))}, "set policies too"
    if case == 8:
        return {"policies": draw(st.sampled_from([[], {}]))}, "policies is empty"
    if case == 9:
        name = draw(st.text(max_size=4).filter(lambda s: s != "a"))
        return {
            "policies": ["a"],
            "policies_to_train": [name],
        }, rf"{re.escape(repr(name))} is not one of the policies \['a'\]"
    if case == 10:
        target = draw(st.integers() | st.text(max_size=4).filter(lambda s: s not in ("a", "b")) | st.none())
        return {
            "policies": ["a", "b"],
            "policy_mapping_fn": {"agent_0": target},
        }, r"is not one of the policies \['a', 'b'\]"
    if case == 11:
        key = draw(st.sampled_from([k for k in KEYS if k not in PPOConfig.POLICY_KEYS]))
        return {"policies": {"a": {key: 1}}}, rf"policy 'a' overrides '{key}', which is not a per-policy key"
    if case == 12:
        value = draw(st.sampled_from([None, [1], 5, "x"]))
        return {"policies": {"a": {"model_config": value}}}, r"policy 'a'.*model_config"
    if case == 13:
        key = draw(st.sampled_from([k for k in PPOConfig.POLICY_KEYS if bounds(k)]))
        return {"policies": {"a": {key: draw(out_of_range(key))}}}, rf"policy 'a': bad value for '{key}'"
    if case == 14:
        key = draw(
            st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(lambda k: k not in ModelConfig.model_fields)
        )
        return {"model_config": {key: 1}}, rf"unknown model_config key '{key}' for model='mlp'"
    if case == 15:
        key, value = draw(
            st.sampled_from(
                [
                    ("hiddens", []),
                    ("hiddens", [0]),
                    ("hiddens", [-3, 4]),
                    ("activation", "gelu"),
                    ("shared_trunk", "x"),
                    ("channels", "middle"),
                    ("conv_filters", [[1, 2]]),
                ]
            )
        )
        return {"model_config": {key: value}}, rf"bad value for 'model_config.{key}'"
    if case == 16:
        value = draw(
            st.floats(max_value=0, allow_subnormal=False)
            | st.just(math.nan)
            | st.integers(max_value=-1)  # (integers are read as floats: -3 as -3.0)
        )
        # non-finite floats stop at the schema, the others at the range check
        return {"clip_rewards": value}, r"clip_rewards=.* must be positive|bad value for 'clip_rewards': -?(nan|inf)"
    if case == 17:
        device = draw(
            st.sampled_from(
                ["banana", "gpu", "cuda:x", "", "cpu:-1"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"])
            )
        )
        return {"device": device}, rf"device='{re.escape(device)}'"
    if case == 18:
        spec = draw(st.sampled_from(["gea", "GAE", "nope", "no_such_module:f", "shoal.algos.advantages:nope"]))
        return {"advantage_estimator": spec}, rf"advantage_estimator.*'{re.escape(spec)}'"
    if case == 19:
        algo, message = draw(
            st.sampled_from(
                [
                    ("ppo2", r"unknown algo 'ppo2'\. Did you mean 'ppo'\?"),
                    ("dqn", r"unknown algo 'dqn'\. Known: ppo"),
                    ("no_such_module:Algo", r"algo 'no_such_module:Algo' cannot be imported"),
                    (5, r"algo must be an algorithm name .* got 5"),
                ]
            )
        )
        return {"algo": algo}, message
    if case == 20:
        model, message = draw(
            st.sampled_from(
                [
                    ("cnn", r"model='cnn' needs image observations"),
                    ("transformer", r"model='transformer' is not one of \['mlp', 'cnn'\]"),
                    ("no_such_module:Net", r"model 'no_such_module:Net' cannot be imported"),
                    (5, r"model must be 'mlp', 'cnn' or a torch.nn.Module subclass, got 5"),
                ]
            )
        )
        return {"model": model}, message
    if case == 21:
        return {"central_critic": draw(st.sampled_from(["team_obs", "state"]))}, r"needs a multi-agent env"
    mapping, message = draw(
        st.sampled_from(
            [
                (None, r"policies \['a', 'b'\] are not named like the agents \['agent_0'\]; set policy_mapping_fn"),
                (5, r"policy_mapping_fn must be a function .* got 5"),
                ("not a spec", r"policy_mapping_fn 'not a spec' must be 'package.module:Name'"),
                ({"agent_1": "a"}, r"policy_mapping_fn maps \['agent_1'\] but not the agents \['agent_0'\]"),
            ]
        )
    )
    return {"policies": ["a", "b"], "policy_mapping_fn": mapping}, message


def assert_config_error(cfg: dict[str, Any], pattern: str) -> None:
    note(f"config {cfg!r}")
    with pytest.raises(shoal.ConfigError, match=pattern):
        build(cfg)


@settings(deadline=None, max_examples=150)
@given(field_mistakes())
def test_a_wrong_type_range_or_name_is_a_config_error_naming_the_key(mistake):
    assert_config_error(*mistake)


@settings(deadline=None, max_examples=150)
@given(inconsistent_configs())
def test_keys_that_do_not_fit_together_are_a_config_error_saying_why(mistake):
    assert_config_error(*mistake)
