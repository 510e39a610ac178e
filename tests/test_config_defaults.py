"""Each config key is declared once; a family or algorithm changes a default as data (``DEFAULTS``).

The expected defaults below were written from the config classes as they were when every family
re-declared the keys it gave another default, so these tests pin that no algorithm's default moved.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from shoal.config import (
    DeterministicActorConfig,
    DQNConfig,
    GRPOConfig,
    MADDPGConfig,
    OffPolicyConfig,
    PPOConfig,
    ReplayActorCriticConfig,
    SACConfig,
    SurrogateConfig,
    TD3Config,
    TrainerConfig,
)

# the keys that used to be declared in more than one class, and each class's default for them
EXPECTED: dict[type[BaseModel], dict[str, Any]] = {
    TrainerConfig: {
        "rollout_fragment_length": None,
        "learning_rate": 0.001,
        "num_envs": 8,
        "gamma": 0.98,
        "lr_schedule": "linear",
    },
    SurrogateConfig: {
        "rollout_fragment_length": None,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 256,
        "num_envs": 8,
        "gamma": 0.98,
        "max_grad_norm": 0.5,
        "lr_schedule": "linear",
        "num_sgd_iter": 20,
        "adam_eps": 1e-05,
    },
    PPOConfig: {
        "rollout_fragment_length": None,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 256,
        "num_envs": 8,
        "gamma": 0.98,
        "max_grad_norm": 0.5,
        "lr_schedule": "linear",
        "num_sgd_iter": 20,
        "adam_eps": 1e-05,
    },
    GRPOConfig: {
        "rollout_fragment_length": None,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 512,
        "num_envs": 8,
        "gamma": 0.98,
        "max_grad_norm": 0.5,
        "lr_schedule": "linear",
        "num_sgd_iter": 4,
        "adam_eps": 1e-05,
    },
    OffPolicyConfig: {
        "rollout_fragment_length": 1,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 256,
        "num_envs": 8,
        "gamma": 0.98,
        "max_grad_norm": 10.0,
        "learning_starts": 100,
        "gradient_steps": 1,
        "tau": 1.0,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 1000000,
    },
    DQNConfig: {
        "rollout_fragment_length": 256,
        "learning_rate": 0.0023,
        "sgd_minibatch_size": 64,
        "num_envs": 1,
        "gamma": 0.99,
        "max_grad_norm": 10.0,
        "learning_starts": 1000,
        "gradient_steps": 128,
        "tau": 1.0,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 100000,
        "advantage_learning": 0.0,
    },
    ReplayActorCriticConfig: {
        "rollout_fragment_length": 1,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 256,
        "num_envs": 1,
        "gamma": 0.99,
        "max_grad_norm": None,
        "learning_starts": 100,
        "gradient_steps": 1,
        "tau": 0.005,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 1000000,
    },
    SACConfig: {
        "rollout_fragment_length": 1,
        "learning_rate": 0.0003,
        "sgd_minibatch_size": 256,
        "num_envs": 1,
        "gamma": 0.99,
        "max_grad_norm": None,
        "learning_starts": 100,
        "gradient_steps": 1,
        "tau": 0.005,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 1000000,
    },
    TD3Config: {
        "rollout_fragment_length": 1,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 256,
        "num_envs": 1,
        "gamma": 0.99,
        "max_grad_norm": None,
        "learning_starts": 100,
        "gradient_steps": 1,
        "tau": 0.005,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 1000000,
        "exploration_noise": 0.1,
    },
    MADDPGConfig: {
        "rollout_fragment_length": 25,
        "learning_rate": 0.001,
        "sgd_minibatch_size": 1024,
        "num_envs": 8,
        "gamma": 0.95,
        "max_grad_norm": 0.5,
        "learning_starts": 2000,
        "gradient_steps": 25,
        "tau": 0.01,
        "lr_schedule": "constant",
        "adam_eps": 1e-08,
        "buffer_size": 1000000,
        "exploration_noise": 0.1,
    },
}
# how many keys each class had; TrainerConfig now also declares the three learner keys every
# algorithm shares (sgd_minibatch_size, max_grad_norm, adam_eps), PPO and SAC have gSDE's two
# (use_sde, sde_sample_freq), and the deterministic actors a noise_type
# + 7: the offline keys (input, output, output_max_file_size, off_policy_estimation_*); + 1: log_interval_s;
# + 1: kind_defaults
KEY_COUNTS = {
    TrainerConfig: 59 + 3 + 7 + 1 + 1,
    SurrogateConfig: 66 + 7 + 1 + 1,
    PPOConfig: 78 + 2 + 7 + 1 + 1,
    GRPOConfig: 70 + 7 + 1 + 1,
    OffPolicyConfig: 73 + 7 + 1 + 1 + 1,
    DQNConfig: 82 + 1 + 7 + 1 + 1 + 1,
    ReplayActorCriticConfig: 73 + 7 + 1 + 1 + 1,
    SACConfig: 76 + 2 + 7 + 1 + 1 + 1,
    TD3Config: 77 + 1 + 7 + 1 + 1 + 1,
    MADDPGConfig: 75 + 1 + 7 + 1 + 1 + 1,
}
ALIASES = {
    TrainerConfig: {"minibatch_size": "sgd_minibatch_size"},
    SurrogateConfig: {"minibatch_size": "sgd_minibatch_size", "update_epochs": "num_sgd_iter"},
    OffPolicyConfig: {"train_freq": "rollout_fragment_length", "minibatch_size": "sgd_minibatch_size"},
}
CONFIGS = [*EXPECTED, DeterministicActorConfig]


def shoal_configs() -> list[type[BaseModel]]:
    """TrainerConfig and every subclass shoal defines."""
    found, todo = [TrainerConfig], [TrainerConfig]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("shoal.") and sub not in found:  # a class with two bases is met twice
                found.append(sub)
                todo.append(sub)
    return found


def test_every_key_is_declared_once():
    declared = defaultdict(list)
    for cls in shoal_configs():
        for name in inspect.get_annotations(cls):
            if name in cls.model_fields:
                declared[name].append(cls.__name__)
    twice = {name: classes for name, classes in declared.items() if len(classes) > 1}
    assert not twice, f"keys declared in more than one config class (set another default in DEFAULTS): {twice}"
    assert set(shoal_configs()) >= set(CONFIGS)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_each_algorithm_keeps_its_defaults(cls):
    expected = EXPECTED[cls]
    fields = {name: cls.model_fields[name].default for name in expected}
    assert fields == expected
    assert {k: type(v) for k, v in fields.items()} == {k: type(v) for k, v in expected.items()}
    schema = cls.model_json_schema()["properties"]
    assert {k: schema[k].get("default") for k in expected} == expected
    built = cls.model_construct()  # the defaults as an instance holds them, before any validator fills them in
    assert {k: getattr(built, k) for k in expected} == expected
    assert len(cls.model_fields) == KEY_COUNTS[cls]


def test_instances_get_the_algorithms_defaults():
    assert DQNConfig.build().learning_rate == 0.0023
    assert (MADDPGConfig.build().gamma, SACConfig.build().gamma, PPOConfig.build().gamma) == (0.95, 0.99, 0.98)
    assert GRPOConfig.build(env="CartPole-v1").sgd_minibatch_size == 512


def test_aliases_are_kept():
    for cls in CONFIGS:
        base = next(b for b in cls.__mro__ if b in ALIASES)
        assert ALIASES[base] == cls.ALIASES, cls.__name__
        assert list(cls.ALIASES) == list(ALIASES[base]), cls.__name__


def test_run_reader_sees_each_algorithms_defaults():
    """``shoal.logging.runs`` reads the defaults from ``model_fields`` to tell the keys a run changed."""
    from shoal.logging.runs import _defaults

    assert _defaults("dqn")["learning_rate"] == 0.0023
    assert _defaults("dqn")["rollout_fragment_length"] == 256
    assert _defaults("maddpg")["gamma"] == 0.95
    assert _defaults("ppo")["learning_rate"] == 0.001


# ----- the DEFAULTS and NOTES data, checked when a class is made -----------------------------------
def test_an_unknown_key_in_defaults_fails_with_a_suggestion():
    with pytest.raises(TypeError, match=r"Odd\.DEFAULTS names 'learing_rate', which is not a key.*'learning_rate'"):

        class Odd(PPOConfig):
            DEFAULTS: ClassVar[dict[str, Any]] = {"learing_rate": 0.1}


def test_a_default_out_of_range_fails():
    with pytest.raises(TypeError, match=r"Odd\.DEFAULTS\['learning_rate'\] = -0\.1 is not a valid learning_rate"):

        class Odd(PPOConfig):
            DEFAULTS: ClassVar[dict[str, Any]] = {"learning_rate": -0.1}

    with pytest.raises(TypeError, match=r"Odd\.DEFAULTS\['num_envs'\] = 1\.5 is not a valid num_envs"):

        class Odd(PPOConfig):
            DEFAULTS: ClassVar[dict[str, Any]] = {"num_envs": 1.5}


def test_a_default_for_a_key_the_class_declares_fails():
    with pytest.raises(TypeError, match=r"Odd\.DEFAULTS sets 'gamma', which Odd declares"):

        class Odd(PPOConfig):
            gamma: float = Field(default=0.9, ge=0.0, le=1.0)
            """Discount."""
            DEFAULTS: ClassVar[dict[str, Any]] = {"gamma": 0.5}


def test_an_unknown_key_in_notes_fails():
    with pytest.raises(TypeError, match=r"Odd\.NOTES names 'gama', which is not a key.*'gamma'"):

        class Odd(PPOConfig):
            NOTES: ClassVar[dict[str, str]] = {"gama": "discounts"}


def test_a_subclass_of_an_algorithm_inherits_and_overrides_defaults():
    class Slow(DQNConfig):
        DEFAULTS: ClassVar[dict[str, Any]] = {"gamma": 0.9}

    class Slower(Slow):
        pass

    assert (Slow.model_fields["gamma"].default, Slow.model_fields["learning_rate"].default) == (0.9, 0.0023)
    assert Slower.build().gamma == 0.9
    assert DQNConfig.model_fields["gamma"].default == 0.99  # the parent keeps its own
    assert Slow.model_json_schema()["properties"]["gamma"]["default"] == 0.9


def test_a_default_for_a_key_with_a_default_factory_or_an_alias():
    """``model_config`` (the alias of ``model_options``) and ``env_config`` (a factory default)
    take a dict default, which each instance gets a copy of."""

    class Small(PPOConfig):
        DEFAULTS: ClassVar[dict[str, Any]] = {"model_config": {"hiddens": [32]}, "env_config": {"sizes": [1]}}

    a, b = Small(), Small()
    assert a.model_options == {"hiddens": [32]} and a.env_config == {"sizes": [1]}
    assert a.env_config["sizes"] is not b.env_config["sizes"]
    assert PPOConfig().env_config == {} and PPOConfig().model_options == {}
