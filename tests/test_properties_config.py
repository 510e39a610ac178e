"""Property-based tests (hypothesis) of configuration: configs drawn from ``PPOConfig``'s own
fields; whatever the schema accepts builds a trainer, and whatever it rejects (wrong type, out of
range, unknown key, inconsistent keys) raises ``shoal.ConfigError`` naming the problem, never
another exception.

The hypothesis profile (derandomized in CI) is chosen in tests/conftest.py.
"""

from __future__ import annotations

import math
import re
import string
import types
import typing
from typing import Any

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st
from test_properties_math import divisors

import shoal
from shoal.algos.ppo import PPOAlgorithm
from shoal.config import PPOConfig
from shoal.config.sampling import LONGEST_COMPLETE_EPISODE
from shoal.models.catalog import ModelConfig

# torch is in every example: no per-example deadline (a first call may compile or allocate)
TORCH = settings(deadline=None)
pytestmark = pytest.mark.usefixtures("no_flush_denormal")


# ----- 3. configuration ---------------------------------------------------------------------

# what the tests pass themselves (shoal.PPO(env=..., save_outputs=False, verbose=0, **config))
FIXED = {"env": "CartPole-v1", "save_outputs": False, "verbose": 0}
FIELDS = {field.alias or name: field for name, field in PPOConfig.model_fields.items()}
KEYS = list(FIELDS)  # the other names of keys (PPOConfig.ALIASES) are tested in test_segments.py


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
    "recreate_failed_workers": st.just(False),  # needs workers: tests/test_faults.py
    "backend": st.just("local"),  # Ray actors: tests/test_ray.py
    "ray_address": st.just(None),
    "num_cpus_per_worker": st.floats(0.25, 4.0),  # read by the Ray backend only
    "remote_worker_envs": st.just(False),  # env actors need Ray workers: tests/test_ray.py
    "num_cpus_per_env": st.floats(0.0, 4.0),  # read with remote_worker_envs only
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
    "advantage_estimator": st.sampled_from(["gae", "vtrace", "shoal.algos.on_policy:rollout_gae"]),
    "use_sde": st.just(False),  # Box actions only: a ConfigError on CartPole (tested below)
    "info_keys": st.lists(st.sampled_from(["x", "is_success"]), max_size=2, unique=True),  # CartPole gives neither
    "output": st.just(None),  # writes datasets: tests/test_offline.py
    "input": st.just("sampler"),  # PPO reads no datasets (its refusal: tests/test_offline.py)
    "off_policy_estimation_methods": st.just([]),  # needs a dataset: tests/test_offline_learners.py
    "off_policy_estimation_input": st.just(None),
    "off_policy_estimation_config": st.just({}),
}
JOINT = {  # drawn together in `valid_configs`
    "rollout_fragment_length",
    "train_batch_size",
    "batch_size",
    "sgd_minibatch_size",
    "bptt_horizon",
    "accumulate_minibatches",
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
    shape = draw(st.sampled_from(["rollout_fragment_length", "train_batch_size", "batch_size", "both", "default"]))
    if shape == "default":
        frag = 32
    if shape in ("rollout_fragment_length", "both"):
        cfg["rollout_fragment_length"] = frag
    if shape in ("train_batch_size", "both"):
        cfg["train_batch_size"] = n * frag
    if shape == "batch_size":  # agent steps: the same number with CartPole's one agent
        cfg["batch_size"] = n * frag
    bptt = draw(st.sampled_from(divisors(frag)))
    if draw(st.booleans()):
        cfg["bptt_horizon"] = bptt
    elif cfg.get("advantage_estimator") == "vtrace" or cfg.get("model_config", {}).get("core"):
        bptt = frag  # the default segment: the whole fragment
    else:
        bptt = 1
    mb = cfg["sgd_minibatch_size"] = draw(st.sampled_from([d for d in divisors(n * frag) if d % bptt == 0]))
    cfg["accumulate_minibatches"] = draw(st.sampled_from(divisors(n * frag // mb)))
    if draw(st.booleans()):
        cfg |= draw(policy_settings())
    if cfg.get("soft_horizon") and cfg.get("horizon") is None:
        cfg["horizon"] = draw(st.integers(1, 1000))
    if cfg.get("vectorization_mode") is not None:  # horizons, info_keys, restarts need envs shoal makes itself
        for key in ("horizon", "soft_horizon", "no_done_at_end", "info_keys", "restart_failed_envs"):
            cfg.pop(key, None)
    if cfg.get("batch_mode") == "complete_episodes" and (cfg.get("horizon") or 0) > LONGEST_COMPLETE_EPISODE:
        cfg["horizon"] = draw(st.integers(1, 1000))  # room for two episodes per row must fit (tested below)
    if cfg.get("batch_mode") == "complete_episodes":  # whole episodes give rows of varying length
        plain = PPOConfig.build(**FIXED | cfg | {"batch_mode": "truncate_episodes"})
        if plain.recurrent or plain.advantage_estimator == "vtrace" or bptt > 1 or plain.prio_alpha:
            del cfg["batch_mode"]  # the segment learner needs rows of equal length
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
        assert trainer.algorithm.buffer.rollout.batch_size == (c.num_envs, c.rollout_capacity + 1)
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
                lambda k: k not in KEYS and k not in FIXED and k not in PPOConfig.ALIASES
            )
        )
        cfg[key] = draw(st.integers() | st.text(max_size=5) | st.none())
        if key in PPOConfig.MOVED:
            return cfg, rf"'{key}' is a model_config key now"
        return cfg, rf"unknown config key '{key}' for PPOConfig\..*Nearest keys: "
    key = draw(st.sampled_from([k for k in KEYS if len(k) >= 5 and k not in FIXED]))
    wrong = draw(typo(key))
    cfg[wrong] = 1
    return cfg, rf"unknown config key '{wrong}' for PPOConfig\. Did you mean '"


@st.composite
def inconsistent_configs(draw) -> tuple[dict[str, Any], str]:
    """Keys each valid alone that do not fit together (or not CartPole), with what the error says."""
    small = st.integers(1, 8)
    case = draw(st.integers(0, 24))
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
        spec = draw(st.sampled_from(["gea", "GAE", "nope", "no_such_module:f", "shoal.algos.on_policy:nope"]))
        return {"advantage_estimator": spec}, rf"advantage_estimator.*'{re.escape(spec)}'"
    if case == 19:
        algo, message = draw(
            st.sampled_from(
                [
                    ("ppo2", r"unknown algo 'ppo2'\. Did you mean 'ppo'\?"),
                    (
                        "sac2",
                        r"unknown algo 'sac2'\. Did you mean 'sac'\? Known: ppo, grpo, dqn, pqn, sac, td3, maddpg",
                    ),
                    ("impala", r"unknown algo 'impala'\. Known: ppo"),
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
    if case == 22:
        return draw(
            st.sampled_from(
                [
                    ({"soft_horizon": True}, r"soft_horizon=True cuts episodes at the horizon; set horizon=H too"),
                    ({"batch_mode": "complete_episodes", "prio_alpha": 0.5}, r"the segment learner .* prio_alpha"),
                    ({"use_sde": True}, r"use_sde=True explores Box actions; 'CartPole-v1' acts in Discrete"),
                    (
                        {"batch_mode": "complete_episodes", "horizon": LONGEST_COMPLETE_EPISODE + 1},
                        r"episodes here may last 100001 steps .* up to 100,000 fit",
                    ),
                    ({"max_restarts_per_hour": 2**63 - 1}, r"max_restarts_per_hour"),
                    (
                        {"use_sde": True, "model_config": {"core": "gru"}},
                        r"use_sde=True reads the actor's last hidden layer.* a recurrent core",
                    ),
                ]
            )
        )
    if case == 23:
        mode = draw(st.sampled_from(["sync", "async", "vector_entry_point"]))
        rules = draw(st.sampled_from([{"horizon": draw(st.integers(1, 1000))}, {"no_done_at_end": True}]))
        return {
            "vectorization_mode": mode,
            **rules,
        }, rf"with vectorization_mode='{mode}' the envs are stepped as one vector"
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
