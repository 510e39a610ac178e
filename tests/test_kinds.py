"""Defaults by env kind: a run with no tuned config for its pair starts from its algorithm's defaults
for the env's kind (image observations, else Box actions), says which and where they come from, and
every key set still wins."""

import json

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.algos import algorithm_class
from shoal.config import load_yaml
from shoal.config.tuned import KINDS, TUNED_DIR, TunedStart, kind_source
from shoal.errors import ConfigError
from shoal.train import setup

KIND_FILES = sorted(TUNED_DIR.glob("*/kinds/*.yaml"))
AN_ENV_OF = {"box": "Pendulum-v1", "image": "MinAtar/Breakout-v1"}


class PixelArm(gym.Env):
    """Image observations and Box actions: the image decides."""

    observation_space = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class BoxPair(shoal.MultiAgentEnv):
    """Two agents with Box actions: several agents keep the algorithm's own defaults."""

    def __init__(self):
        self.possible_agents = self.agents = ["a", "b"]
        self.observation_spaces = dict.fromkeys(self.agents, gym.spaces.Box(-1.0, 1.0, (3,)))
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Box(-1.0, 1.0, (1,)))


@pytest.mark.parametrize("path", KIND_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_each_kind_s_defaults_build_for_an_env_of_that_kind_and_name_their_source(path):
    assert path.stem in KINDS
    data = load_yaml(path)
    assert not {"algo", "env", "total_timesteps"} & set(data), "a kind's defaults serve every env of the kind"
    algorithm_class(path.parent.parent.name).config_class.build(env=AN_ENV_OF[path.stem], **data)
    assert path.read_text().startswith("# source: ") and len(kind_source(path)) > 10


class FloatVolume(PixelArm):
    """A float 3-D Box: numbers laid out in a grid, not pixels."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3, 16, 16), np.float32)
    action_space = gym.spaces.Discrete(2)


def test_the_kind_is_read_off_the_env_s_spaces():
    assert setup.env_kind({"env": "Pendulum-v1"}) == "box"
    assert setup.env_kind({"env": "MinAtar/Breakout-v1"}) == "image"
    assert setup.env_kind({"env": PixelArm}) == "image"  # the pixels decide before the Box actions
    assert setup.env_kind({"env": FloatVolume}) is None
    assert setup.env_kind({"env": "CartPole-v1"}) is None
    assert setup.env_kind({"env": "pettingzoo:mpe2.simple_spread_v3"}) is None  # several agents
    assert setup.env_kind({"env": BoxPair}) is None


def test_the_env_made_to_look_is_closed_and_the_user_s_own_is_not(monkeypatch):
    closed = []
    monkeypatch.setattr(PixelArm, "close", lambda self: closed.append(self), raising=False)
    assert setup.env_kind({"env": PixelArm}) == "image" and len(closed) == 1
    env = PixelArm()
    assert setup.env_kind({"env": env}) == "image" and closed == [closed[0]]


def test_an_env_that_cannot_be_made_to_look_keeps_the_algorithm_s_defaults_and_says_why():
    with pytest.warns(shoal.ShoalWarning, match="could not make 'NoSuchEnv-v0' to pick its kind's defaults"):
        assert setup.env_kind({"env": "NoSuchEnv-v0"}) is None


def test_a_box_env_with_no_tuned_config_starts_from_the_continuous_control_defaults_and_says_so(capsys):
    with shoal.PPO(env="Pendulum-v1", tuned=False, save_outputs=False) as t:
        assert t.tuned_config == TUNED_DIR / "ppo" / "kinds" / "box.yaml"
        c = t.config
        assert (c.num_envs, c.rollout_fragment_length, c.sgd_minibatch_size, c.num_sgd_iter) == (1, 2048, 64, 10)
        assert (c.gamma, c.gae_lambda, c.vf_clip_coef, c.normalize_obs, c.normalize_reward) == (
            0.99,
            0.95,
            0.2,
            True,
            True,
        )
    err = capsys.readouterr().err
    assert "starting from the defaults for Box actions" in err and "ppo_continuous_action" in err


def test_kind_defaults_false_starts_from_the_algorithm_s_own():
    with shoal.PPO(env="Pendulum-v1", tuned=False, kind_defaults=False, save_outputs=False, verbose=0) as t:
        assert t.tuned_config is None
        assert (t.config.num_envs, t.config.gamma, t.config.normalize_obs) == (8, 0.98, False)
    with pytest.raises(ConfigError, match="bad value for 'kind_defaults': 'no': expected true or false"):
        shoal.PPO(env="Pendulum-v1", kind_defaults="no", save_outputs=False)


def test_keys_set_win_over_the_kind_s_defaults_by_the_tuned_configs_rules():
    with shoal.PPO(env="Pendulum-v1", tuned=False, save_outputs=False, verbose=0, num_envs=4, gamma=0.9) as t:
        c = t.config
        # 4 envs x 2048 steps keep the defaults' 32 minibatches
        assert (c.num_envs, c.rollout_fragment_length, c.sgd_minibatch_size, c.gamma) == (4, 2048, 256, 0.9)


def test_an_image_env_starts_from_the_cnn_defaults():
    with shoal.PPO(env=PixelArm, save_outputs=False, verbose=0) as t:
        assert t.tuned_config == TUNED_DIR / "ppo" / "kinds" / "image.yaml"
        assert (t.config.model, t.config.num_envs, t.config.rollout_fragment_length) == ("cnn", 8, 128)


def test_algorithms_without_kind_defaults_never_make_the_env_to_look(monkeypatch):
    def looked(settings):
        raise AssertionError("the env was made to find its kind")

    monkeypatch.setattr(setup, "env_kind", looked)
    with shoal.SAC(env="Pendulum-v1", tuned=False, save_outputs=False, verbose=0) as t:
        assert t.tuned_config is None  # SAC's own defaults are Stable-Baselines3's continuous ones
    with shoal.PPO(env="Acrobot-v1", save_outputs=False, verbose=0) as t:  # a tuned config: no kind needed
        assert t.tuned_config == TUNED_DIR / "ppo" / "Acrobot-v1.yaml"


def test_a_config_error_on_a_key_the_kind_set_names_the_file():
    start = TunedStart(TUNED_DIR / "ppo" / "kinds" / "box.yaml", frozenset({"sgd_minibatch_size"}), "box")
    expected = r"sgd_minibatch_size came from .*kinds/box\.yaml; kind_defaults=false leaves it out\.\)"
    with pytest.raises(ConfigError, match=expected), start.named_in_errors():
        raise ConfigError("sgd_minibatch_size=64 does not divide the batch")


def test_a_run_started_from_a_kind_s_defaults_resumes_with_the_same_settings(tmp_path):
    run = tmp_path / "run"
    short = dict(rollout_fragment_length=64, sgd_minibatch_size=64, num_sgd_iter=1)
    with shoal.PPO(env="Pendulum-v1", tuned=False, seed=1, run_dir=str(run), verbose=0, **short) as algo:
        algo.learn(64)
        settings = algo.config.to_yaml_dict()
    assert settings["normalize_reward"] is True and settings["gae_lambda"] == 0.95  # from the Box kind
    with shoal.PPO.from_checkpoint(run, total_timesteps=128) as resumed:
        assert resumed.config.to_yaml_dict() == settings | {"total_timesteps": 128}
        assert resumed.tuned_config == TUNED_DIR / "ppo" / "kinds" / "box.yaml"
        resumed.learn()
    assert json.loads((run / "result.json").read_text())["tuned_config"].endswith("kinds/box.yaml")
