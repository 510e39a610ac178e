"""Config keys and the checks made before anything is built."""

import pytest

import shoal
from shoal.config import PPOConfig, load_yaml, parse_overrides
from shoal.errors import ConfigError


def test_defaults_resolve_rollout_shape():
    c = PPOConfig.build()
    assert (c.num_envs, c.rollout_fragment_length, c.train_batch_size) == (8, 32, 256)
    c = PPOConfig.build(num_envs=4, train_batch_size=512)
    assert c.rollout_fragment_length == 128


def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'learing_rate'.*Did you mean 'learning_rate'\?"):
        PPOConfig.build(learing_rate=1e-3)


def test_conflicting_batch_sizes_name_numbers_and_suggest():
    with pytest.raises(
        ConfigError,
        match=r"train_batch_size=1000 must equal num_envs=8 x rollout_fragment_length=64 = 512"
        r".*rollout_fragment_length=125",
    ):
        PPOConfig.build(num_envs=8, rollout_fragment_length=64, train_batch_size=1000)
    with pytest.raises(
        ConfigError, match=r"train_batch_size=100 is not divisible by num_envs=8.*Try train_batch_size=96 or 104"
    ):
        PPOConfig.build(train_batch_size=100)
    with pytest.raises(
        ConfigError, match=r"sgd_minibatch_size=100 must divide the 256 agent steps.*Try sgd_minibatch_size=128"
    ):
        PPOConfig.build(sgd_minibatch_size=100).check_batch()
    with pytest.raises(
        ConfigError, match=r"sgd_minibatch_size=512 must divide the 256 agent steps.*Try sgd_minibatch_size=256"
    ):
        shoal.PPO(sgd_minibatch_size=512, save_outputs=False)
    with pytest.raises(
        ConfigError,
        match=r"sgd_minibatch_size=500 must divide the 768 agent steps.*x 3 agents\). Try sgd_minibatch_size=384",
    ):
        shoal.PPO(env="pettingzoo:mpe2.simple_spread_v3", sgd_minibatch_size=500, save_outputs=False)


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"bad value for 'gamma': 1.5"):
        PPOConfig.build(gamma=1.5)
    with pytest.raises(ConfigError, match=r"bad value for 'model_config.activation': 'gelu'"):
        PPOConfig.build(model_config={"activation": "gelu"})


def test_overrides_are_parsed_as_yaml_scalars():
    assert parse_overrides(
        [
            "seed=2",
            "model_config.hiddens=[32, 32]",
            "target_kl=null",
            "norm_adv=false",
            "env=CartPole-v1",
            "model_config.activation=relu",
        ]
    ) == {
        "seed": 2,
        "model_config": {"hiddens": [32, 32], "activation": "relu"},
        "target_kl": None,
        "norm_adv": False,
        "env": "CartPole-v1",
    }
    with pytest.raises(ConfigError, match="expected key=value, got 'seed'"):
        parse_overrides(["seed"])


def test_yaml_is_loaded_safely(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("seed: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_yaml(tmp_path / "list.yaml")


def test_shipped_configs_are_valid():
    from pathlib import Path

    files = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))
    assert len(files) >= 4
    for path in files:
        c = PPOConfig.build(**load_yaml(path))
        assert c.total_timesteps >= 100_000, path.name


def test_version_is_one_value_for_the_package_and_the_command_line(capsys):
    from importlib.metadata import version

    from shoal.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"shoal {shoal.__version__}" == f"shoal {version('shoal')}"
