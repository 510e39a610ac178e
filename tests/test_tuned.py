"""Tuned configs: every shipped file is valid and where the lookup expects it; the lookup is used,
overridden by explicit keys and turned off by the flag."""

import json
from pathlib import Path

import pytest

import shoal
from shoal.algos import algorithm_class
from shoal.config import DQNConfig, PPOConfig, load_yaml
from shoal.config.tuned import TUNED_DIR, apply_tuned, env_slug, tuned_path
from shoal.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for p in TUNED_DIR.glob("*/*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_config_is_valid_cites_its_source_and_sits_where_the_lookup_looks(path):
    data = load_yaml(path)
    algo = data.get("algo", "ppo")
    config = algorithm_class(algo).config_class.build(**data)
    assert config.total_timesteps >= 20_000, "a tuned config is a real training run"
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    sources = ("rl-baselines3-zoo", "rl-zoo", "CleanRL", "paper", "gymnax", "Source: none published")
    tuned = path.parent.name != "examples"  # examples are variants of a tuned config, which cites the source
    assert path.read_text().startswith("# ") and (any(s in header for s in sources) or not tuned), (
        f"{path.name} must open with a comment naming its source (one of {sources})"
    )
    if path.parent.name != "examples":
        assert (path.parent.name, path.stem) == (algo, env_slug(data["env"]))
        assert tuned_path(algo, data["env"]) == path


def test_the_repository_shows_the_tuned_configs_as_configs():
    assert (ROOT / "configs").resolve() == TUNED_DIR
    assert (ROOT / "configs" / "ppo" / "LunarLander-v3.yaml").is_file()


def test_trainer_starts_from_the_tuned_config_and_says_so(capsys):
    with shoal.PPO(env="Acrobot-v1", save_outputs=False) as t:
        assert t.tuned_config == TUNED_DIR / "ppo" / "Acrobot-v1.yaml"
        assert (t.config.num_envs, t.config.rollout_fragment_length, t.config.gae_lambda) == (16, 250, 0.94)
        assert t.config.tuned is True
    assert "starting from the tuned config" in capsys.readouterr().err


def test_explicit_keys_override_the_tuned_config_and_the_flag_turns_it_off():
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, gae_lambda=0.9) as t:
        assert (t.config.num_envs, t.config.gae_lambda, t.config.learning_rate) == (16, 0.9, 0.001)
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, tuned=False) as t:
        assert t.tuned_config is None
        assert (t.config.num_envs, t.config.gae_lambda) == (8, 0.8)  # the defaults


def test_no_tuned_config_for_other_pairs_or_algorithms_of_your_own():
    assert tuned_path("ppo", "Acrobot-v1") is not None
    assert tuned_path("grpo", "Acrobot-v1") is None
    assert tuned_path("examples.reinforce:Reinforce", "Acrobot-v1") is None
    assert tuned_path("ppo", object()) is None
    settings = {"env": "Acrobot-v1", "num_envs": 2}
    assert apply_tuned(settings, "grpo", PPOConfig) == (settings, None)


def test_a_key_set_replaces_the_tuned_one_whole_under_either_name():
    merged, _ = apply_tuned({"env": "CartPoleNoVel-v1", "model_config": {"hiddens": [64]}}, "ppo", PPOConfig)
    assert merged["model_config"] == {"hiddens": [64]}  # not the tuned LSTM with these hiddens
    merged, _ = apply_tuned({"env": "CartPoleNoVel-v1", "model": "examples.custom_model:Net"}, "ppo", PPOConfig)
    assert "model_config" not in merged  # the tuned one was written for the built-in model
    merged, _ = apply_tuned({"env": "Acrobot-v1", "rollout_fragment_length": 8}, "dqn", DQNConfig)
    assert "train_freq" not in merged and merged["rollout_fragment_length"] == 8  # one key, two names
    with pytest.raises(ConfigError, match="bad value for 'tuned': 'false': expected true or false"):
        apply_tuned({"env": "Acrobot-v1", "tuned": "false"}, "ppo", PPOConfig)


def test_a_reshaped_batch_keeps_the_tuned_number_of_minibatches():
    merged, _ = apply_tuned({"env": "Acrobot-v1", "num_envs": 2}, "ppo", PPOConfig)
    assert (merged["rollout_fragment_length"], merged["sgd_minibatch_size"]) == (250, 125)  # 4 minibatches
    assert merged["gae_lambda"] == 0.94  # the rest stays tuned
    merged, _ = apply_tuned({"env": "Acrobot-v1", "train_batch_size": 1000}, "ppo", PPOConfig)
    assert "rollout_fragment_length" not in merged and merged["sgd_minibatch_size"] == 250
    merged, _ = apply_tuned({"env": "Acrobot-v1", "num_envs": 3}, "ppo", PPOConfig)
    assert "sgd_minibatch_size" not in merged  # 750 steps in 4 minibatches: the default size then
    merged, _ = apply_tuned({"env": "Acrobot-v1", "num_sgd_iter": 2}, "ppo", PPOConfig)
    assert (merged["num_envs"], merged["rollout_fragment_length"], merged["sgd_minibatch_size"]) == (16, 250, 1000)
    merged, _ = apply_tuned({"env": "Acrobot-v1", "num_envs": 4}, "dqn", DQNConfig)
    assert merged["sgd_minibatch_size"] == 128  # a replay minibatch need not divide the batch
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, num_envs=2) as t:
        assert (t.config.num_envs, t.config.rollout_fragment_length, t.config.sgd_minibatch_size) == (2, 250, 125)
    with pytest.raises(
        ConfigError,
        match=r"sgd_minibatch_size=256 must divide.*\(rollout_fragment_length came from the tuned config .*Acrobot",
    ):
        shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, num_envs=3)


@pytest.mark.parametrize("flag", [[], ["--no-tuned"]])
def test_the_command_line_starts_from_the_tuned_config_unless_the_flag_is_given(tmp_path, capsys, flag):
    from shoal.cli import main

    run = tmp_path / "run"
    argv = ["train", "Acrobot-v1", *flag, "total_timesteps=2000", "--eval-episodes", "1", "--run-dir", str(run)]
    assert main(argv) == 0
    said = "starting from the tuned config" in capsys.readouterr().err
    assert said == (not flag)
    assert load_yaml(run / "config.yaml")["num_envs"] == (8 if flag else 16)
    tuned = json.loads((run / "result.json").read_text())["tuned_config"]
    assert tuned == (None if flag else str(TUNED_DIR / "ppo" / "Acrobot-v1.yaml"))
