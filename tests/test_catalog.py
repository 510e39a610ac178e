"""``model=`` and ``model_config=``: the built-in models, a user's own module (its contract checked
at start), Dict observations with an image, and every bad setting stopping with one clear message."""

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import shoal
from shoal.cli import main
from shoal.models.networks import EncoderModel, MLPModel

FAST = dict(num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, save_outputs=False, verbose=0)


class TwoTowers(nn.Module):
    """A user's actor-critic: plain torch layers, PyTorch's default init."""

    def __init__(self, obs_space, action_space, num_outputs, hidden=64):
        super().__init__()
        n = obs_space.shape[0]
        self.pi = nn.Sequential(
            nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_outputs)
        )
        self.v = nn.Sequential(
            nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def forward(self, obs):
        return self.pi(obs), self.v(obs).squeeze(-1)


@pytest.mark.slow
def test_a_users_own_module_solves_cartpole_within_100k_steps():
    with shoal.PPO(env="CartPole-v1", model=TwoTowers, seed=1, save_outputs=False, verbose=0) as algo:
        assert isinstance(algo.get_policy().model, TwoTowers)
        algo.learn(100_000)
        assert algo.evaluate(20)["episode_reward_mean"] >= 475


def test_a_users_module_is_named_by_import_path_and_gets_model_config_as_keywords(tmp_path):
    with shoal.PPO(model="test_catalog:TwoTowers", model_config={"hidden": 16}, **FAST) as algo:
        assert algo.get_policy().model.pi[0].out_features == 16
        algo.train()
        path = algo.save(tmp_path / "ckpt")
    with shoal.PPO.from_checkpoint(path) as again:  # stored as 'module:Class', imported again
        assert isinstance(again.get_policy().model, TwoTowers)


class Wrong(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs, returns="pair"):
        super().__init__()
        self.layer, self.n, self.returns = nn.Linear(4, num_outputs + 1), num_outputs, returns

    def forward(self, obs):
        out = self.layer(obs)
        if self.returns == "one":
            return out
        if self.returns == "column":
            return out[:, : self.n], out[:, self.n :]
        return out, out[:, 0]  # dist inputs one too wide


class Frozen(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()
        self.layer = nn.Linear(4, num_outputs + 1).requires_grad_(False)


@pytest.mark.parametrize(
    "model,config,message",
    [
        (
            Wrong,
            {"returns": "one"},
            r"Wrong.forward returned one tensor of shape \[2, 3\]; expected a pair "
            r"\(dist_inputs \[B, 2\], value \[B\]\)",
        ),
        (
            Wrong,
            {},
            r"returned dist_inputs of shape \[2, 3\] and dtype torch.float32; expected \[2, 2\] float for "
            r"Discrete\(2\)",
        ),
        (
            Wrong,
            {"returns": "column"},
            r"returned value of shape \[2, 1\].*expected \[2\] float \(squeeze the last dim\)",
        ),
        (
            Wrong,
            {"bad_key": 1},
            r"model Wrong cannot be built as Wrong\(obs_space, action_space, num_outputs, "
            r"\*\*model_config\) with model_config=\{'bad_key': 1\}: .*bad_key",
        ),
        (Frozen, {}, "model Frozen has no trainable parameters"),
    ],
)
def test_a_users_module_that_breaks_the_contract_is_named_with_what_it_returned(model, config, message):
    with pytest.raises(shoal.ConfigError, match=message):
        shoal.PPO(model=model, model_config=config, **FAST)


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(model_config={"hiddens": [0]}), r"'model_config.hiddens': \[0\]: every layer size.*positive integer"),
        (dict(model_config={"hiddens": [64, -1]}), r"'model_config.hiddens': \[64, -1\]: every layer size"),
        (
            dict(model_config={"hiddens": []}),
            r"'model_config.hiddens': \[\]: no hidden layers is only for a recurrent core",
        ),
        (dict(model_config={"conv_filters": [[16, 0, 1]]}), r"'model_config.conv_filters'.*positive integer"),
        (
            dict(model_config={"hidens": [8]}),
            r"unknown model_config key 'hidens' for model='mlp'. Did you mean 'hiddens'",
        ),
        (dict(model="cnnn"), r"model='cnnn' is not one of \['mlp', 'cnn'\]. Did you mean 'cnn'"),
        (dict(model="nowhere:Net"), r"model 'nowhere:Net' cannot be imported"),
        (dict(model="cnn"), r"model='cnn' needs image observations.*'CartPole-v1' observes Box"),
        (dict(hiddens=[64]), r"'hiddens' is a model_config key now: model_config=\{'hiddens'"),
        (dict(algo="ppp"), r"unknown algo 'ppp'. Did you mean 'ppo'"),
        (dict(clip_rewards=-1.0), r"clip_rewards=-1.0 must be positive"),
    ],
)
def test_bad_model_settings_stop_with_one_clear_message(settings, message):
    with pytest.raises(shoal.ConfigError, match=message):
        shoal.Trainer(**{**FAST, **settings})


@pytest.mark.parametrize(
    "pair,message",
    [
        ("model_config.hiddens=[0]", "every layer size"),
        ("model=cnn", "needs image observations"),
        ("algo=ppp", "Did you mean 'ppo'"),
        ("model_config.hidens=[8]", "Did you mean 'hiddens'"),
        ("hiddens=[32]", "model_config key now"),
    ],
)
def test_the_command_line_exits_with_the_message_and_no_traceback(pair, message, capsys):
    assert main(["train", "CartPole-v1", pair, "save_outputs=false", "verbose=0"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "pairs,message",
    [
        (
            ["model_config.conv_filters=[[16,20,1]]"],
            r"does not fit 'MinAtar/Breakout-v1'.*\(10, 10, 4\), read as \[H, W, C\]",
        ),
        (["model_config.channels=first", "model_config.conv_filters=[[16,5,1]]"], r"read as \[C, H, W\].*set channels"),
    ],
)
def test_a_conv_stack_that_does_not_fit_the_image_exits_with_the_message(pairs, message, capsys):
    assert main(["train", "MinAtar/Breakout-v1", "model=cnn", *pairs, "save_outputs=false", "verbose=0"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err and err.count("\n") == 1


def test_mlp_reads_images_flat_also_with_a_shared_trunk():
    with shoal.PPO(env="MinAtar/Breakout-v1", model="mlp", model_config={"shared_trunk": True}, **FAST) as algo:
        net = algo.get_policy().model
        assert not any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
        assert algo.train()["timesteps_this_iter"] > 0


@pytest.mark.slow
def test_a_dict_observation_with_an_image_and_a_vector_learns():
    """SideSwitch: reading one key alone scores 4 of 8, a random policy 2; the CNN for the image
    and the vector side by side reach near 8 within 4k steps (about 8 s)."""
    with shoal.PPO(env="shoal.envs.examples:SideSwitch-v0", model="cnn", seed=1, save_outputs=False, verbose=0) as algo:
        encoder = algo.get_policy().model.actor[0]
        assert [kind for _, kind, _, _ in encoder.leaves] == ["image", "vector"]
        before = algo.evaluate(20)["episode_reward_mean"]
        algo.learn(4096)
        after = algo.evaluate(20)["episode_reward_mean"]
    assert before < 4.5 and after >= 6.5, (before, after)


def test_shared_trunk_and_activation_options_reach_the_network():
    with shoal.PPO(model_config={"shared_trunk": True, "hiddens": [32], "activation": "relu"}, **FAST) as algo:
        model = algo.get_policy().model
        assert isinstance(model, EncoderModel) and model.critic is None
        assert [type(m).__name__ for m in model.actor[1]] == ["Linear", "ReLU"] and model.actor[1][0].out_features == 32
        algo.train()
    with shoal.PPO(model_config={"hiddens": [32, 16], "activation": "relu"}, **FAST) as algo:
        model = algo.get_policy().model
        assert isinstance(model, MLPModel) and model.activation == "relu"
        assert [w.shape[-1] for w in model.weights] == [32, 16]


class ImageEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_image_observations_get_a_cnn_on_request_and_a_hint_otherwise():
    with shoal.PPO(env=ImageEnv, **FAST) as algo:  # PPO's defaults for image observations: the CNN
        assert any(isinstance(m, torch.nn.Conv2d) for m in algo.get_policy().model.modules())
    with pytest.warns(UserWarning, match=r"observations are images \[16, 16, 3\] uint8; model='cnn'"):
        shoal.GRPO(env=ImageEnv, group_size=2, **FAST).close()  # GRPO has no such defaults: the MLP, and a hint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shoal.PPO(env=ImageEnv, model="mlp", **FAST).close()  # chosen on purpose: no hint
    with shoal.PPO(
        env=ImageEnv, model="cnn", model_config={"conv_filters": [[8, 4, 2]], "channels": "last"}, **FAST
    ) as algo:
        conv = algo.get_policy().model.actor[0].net[0]
        assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (3, 8, (4, 4))
        assert algo.algorithm.buffer.rollout["obs"].dtype == torch.uint8  # images stay uint8 in the rollout
        algo.train()
    with pytest.raises(shoal.ConfigError, match=r"normalize_obs=True normalizes float observations; .* uint8"):
        shoal.PPO(env=ImageEnv, model="cnn", normalize_obs=True, **FAST)
