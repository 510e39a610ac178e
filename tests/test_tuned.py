"""Tuned configs: every shipped file is valid and where the lookup expects it; the lookup is used,
overridden by explicit keys and turned off by the flag."""

from pathlib import Path

import pytest

import shoal
from shoal.algos import algorithm_class
from shoal.cli import _parse, _resolve
from shoal.config import load_yaml
from shoal.config.tuned import TUNED_DIR, apply_tuned, env_slug, tuned_pairs, tuned_path

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for p in TUNED_DIR.glob("*/*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_config_is_valid_cites_its_source_and_sits_where_the_lookup_looks(path):
    data = load_yaml(path)
    algo = data.get("algo", "ppo")
    config = algorithm_class(algo).config_class.build(**data)
    assert config.total_timesteps >= 20_000, "a tuned config is a real training run"
    assert path.read_text().startswith("# "), "each config opens with a comment saying where its settings come from"
    if path.parent.name != "examples":
        assert (path.parent.name, path.stem) == (algo, env_slug(data["env"]))
        assert tuned_path(algo, data["env"]) == path


def test_the_repository_shows_the_tuned_configs_as_configs():
    assert (ROOT / "configs").resolve() == TUNED_DIR
    assert ("ppo", "LunarLander-v3") in tuned_pairs() and ("sac", "Pendulum-v1") in tuned_pairs()


def test_trainer_starts_from_the_tuned_config_and_says_so(capsys):
    with shoal.PPO(env="Acrobot-v1", save_outputs=False) as t:
        assert t.tuned_config == TUNED_DIR / "ppo" / "Acrobot-v1.yaml"
        assert (t.config.num_envs, t.config.rollout_fragment_length, t.config.gae_lambda) == (16, 250, 0.94)
        assert t.config.tuned is True
    assert "starting from the tuned config" in capsys.readouterr().err


def test_explicit_keys_override_the_tuned_config_and_the_flag_turns_it_off():
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, num_envs=4, sgd_minibatch_size=500) as t:
        assert (t.config.num_envs, t.config.rollout_fragment_length) == (4, 250)  # the rest stays tuned
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0, tuned=False) as t:
        assert t.tuned_config is None
        assert (t.config.num_envs, t.config.gae_lambda) == (8, 0.8)  # the defaults


def test_no_tuned_config_for_other_pairs_or_algorithms_of_your_own():
    assert tuned_path("ppo", "Acrobot-v1") is not None
    assert tuned_path("grpo", "Acrobot-v1") is None
    assert tuned_path("examples.reinforce:Reinforce", "Acrobot-v1") is None
    assert tuned_path("ppo", object()) is None
    settings = {"env": "Acrobot-v1", "num_envs": 2}
    assert apply_tuned(settings, "grpo") == (settings, None)


def test_nested_keys_merge_into_the_tuned_ones():
    merged, path = apply_tuned({"env": "Acrobot-v1", "algo": "dqn", "model_config": {"activation": "tanh"}}, "dqn")
    assert path == TUNED_DIR / "dqn" / "Acrobot-v1.yaml"
    assert merged["model_config"] == {"hiddens": [256, 256], "activation": "tanh"}


def test_cli_flag_and_key_turn_the_tuned_config_off():
    assert _resolve(_parse(["train", "Acrobot-v1", "--no-tuned"]))["tuned"] is False
    assert _resolve(_parse(["train", "Acrobot-v1", "tuned=false"]))["tuned"] is False
    assert "tuned" not in _resolve(_parse(["train", "Acrobot-v1"]))
