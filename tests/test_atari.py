"""Atari preprocessing and MinAtar by id: each wrapper on a tiny fake game with known frames, then
the real ALE and MinAtar envs as ``config_creator`` makes them."""

import sys

import gymnasium as gym
import numpy as np
import pytest

from shoal.envs.atari import PALETTE, EpisodicLife, FrameStack, MaxAndSkip, NoopReset, is_atari_id
from shoal.envs.registry import check_env_id, config_creator
from shoal.errors import ConfigError, EnvError

FIRE = 1  # Breakout's action that launches the ball


class FakeAtari(gym.Env):
    """Frame t is a 1x4 image, zero but for the value t at column t % 4, so a max-pool shows which
    frames it took. Reward t on step t; a life is lost every ``life_every`` frames; info has
    ``lives`` and ``t`` (frames since the last real reset)."""

    def __init__(self, lives: int = 3, life_every: int = 1000):
        self.observation_space = gym.spaces.Box(0, 255, (1, 4), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.start_lives, self.life_every = lives, life_every
        self.t, self.lives, self.resets = 0, lives, 0

    def frame(self) -> np.ndarray:
        out = np.zeros((1, 4), np.uint8)
        out[0, self.t % 4] = self.t
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.lives = 0, self.start_lives
        self.resets += 1
        return self.frame(), {"lives": self.lives, "t": 0}

    def step(self, action):
        self.t += 1
        if self.t % self.life_every == 0:
            self.lives -= 1
        return self.frame(), float(self.t), self.lives == 0, False, {"lives": self.lives, "t": self.t}


def wrappers(env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_skip_sums_rewards_and_pools_only_the_last_two_frames():
    env = MaxAndSkip(FakeAtari(lives=1, life_every=5), skip=4)
    env.reset()
    obs, reward, terminated, _, _ = env.step(0)  # frames 1..4: only 3 and 4 pooled
    assert obs.tolist() == [[4, 0, 0, 3]] and reward == 1 + 2 + 3 + 4 and not terminated
    obs, reward, terminated, _, _ = env.step(0)  # game over on frame 5: frame 4 is from the last step
    assert obs.tolist() == [[0, 5, 0, 0]] and reward == 5 and terminated
    env = MaxAndSkip(FakeAtari(lives=1, life_every=2), skip=4)
    env.reset()
    obs, reward, terminated, _, _ = env.step(0)
    assert obs.tolist() == [[0, 1, 2, 0]] and reward == 3 and terminated


def test_noop_reset_count_is_within_bounds_and_seeded():
    env = NoopReset(FakeAtari(), noop_max=5)
    counts = [env.reset(seed=seed)[1]["t"] for seed in range(100)]
    assert set(counts) == {1, 2, 3, 4, 5}
    assert [env.reset(seed=seed)[1]["t"] for seed in range(100)] == counts
    assert NoopReset(FakeAtari(), noop_max=0).reset(seed=0)[1]["t"] == 0


def test_frames_shift_by_one_and_the_newest_is_last():
    env = FrameStack(FakeAtari(), k=4)
    obs, _ = env.reset()
    assert obs.shape == (4, 1, 4) and obs.dtype == np.uint8 and not obs.any()
    for t in (1, 2, 3, 4, 5):
        before = obs
        obs, *_ = env.step(0)
        assert obs[-1].tolist() == [[t if t % 4 == i else 0 for i in range(4)]]
        np.testing.assert_array_equal(obs[:-1], before[1:])


def test_life_loss_ends_the_learning_episode_and_reset_continues_the_game():
    game = FakeAtari(lives=3, life_every=3)
    env = FrameStack(EpisodicLife(game), k=2)
    env.reset()
    for _ in range(2):
        _, _, terminated, _, info = env.step(0)
        assert not terminated and "episode_continues" not in info
    _, _, terminated, _, info = env.step(0)
    assert terminated and info["episode_continues"] and info["lives"] == 2
    obs, info = env.reset()  # soft reset: one no-op step on, same game, stack refilled with it
    assert info["t"] == 4 and info["lives"] == 2 and game.resets == 1
    assert (obs == obs[-1]).all() and obs[-1, 0, 0] == 4
    for _ in range(5):
        _, _, terminated, _, info = env.step(0)
    assert terminated and "episode_continues" not in info and info["lives"] == 0
    assert env.reset()[1]["t"] == 0 and game.resets == 2
    env.step(0)
    assert env.reset(seed=1)[1]["t"] == 0 and game.resets == 3  # a seeded reset restarts the game


def test_breakout_is_preprocessed_with_sticky_actions_and_no_ale_frameskip():
    env = config_creator("ALE/Breakout-v5")({})
    assert wrappers(env)[:5] == ["FrameStack", "EpisodicLife", "ResizeObservation", "MaxAndSkip", "NoopReset"]
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs.any()
    assert env.step(FIRE)[0].shape == (4, 84, 84)
    assert env.unwrapped._frameskip == 1
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_breakout_life_loss_in_training_but_not_in_evaluation():
    env = config_creator("ALE/Breakout-v5")({})
    env.reset(seed=0)
    for _ in range(500):  # the paddle never moves, so the ball is soon lost
        _, _, terminated, truncated, info = env.step(FIRE)
        if terminated or truncated:
            break
    assert terminated and info["episode_continues"] and info["lives"] == 4
    _, after = env.reset()
    assert after["lives"] == 4 and after["episode_frame_number"] == info["episode_frame_number"] + 4

    env = config_creator("ALE/Breakout-v5", evaluation=True)({"screen_size": 42, "frame_stack": 2})
    assert "EpisodicLife" not in wrappers(env)
    obs, info = env.reset(seed=0)
    assert obs.shape == (2, 42, 42)
    for _ in range(500):
        obs, _, terminated, _, info = env.step(FIRE)
        assert not terminated
        if info["lives"] < 5:
            break
    assert info["lives"] == 4 and "episode_continues" not in info


def test_render_gives_the_colour_frame():
    env = config_creator("ALE/Breakout-v5")({"render_mode": "rgb_array"})
    env.reset(seed=0)
    frame = env.render()
    assert env.render_mode == "rgb_array"
    assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8
    assert (frame[..., 0] != frame[..., 1]).any()


@pytest.mark.parametrize(
    "config, bad",
    [
        ({"frame_stack": 0}, "frame_stack=0"),
        ({"screen_size": 8.5}, "screen_size=8.5"),
        ({"noop_max": -1}, "noop_max=-1"),
        ({"frame_skip": True}, "frame_skip=True"),
        ({"episodic_life": "yes"}, "episodic_life='yes'"),
        ({"frameskip": 4}, "frameskip=4.*set frame_skip"),
        ({"obs_type": "rgb"}, "obs_type='rgb'.*'grayscale'"),
    ],
)
def test_bad_preprocessing_options_are_named(config, bad):
    with pytest.raises(ConfigError, match=bad):
        config_creator("ALE/Breakout-v5")(config)


def test_ids_are_recognised_and_unknown_games_get_a_suggestion():
    check_env_id("ALE/Pong-v5")
    check_env_id("MinAtar/Breakout-v1")
    assert is_atari_id("ALE/Pong-v5") and not is_atari_id("MinAtar/Breakout-v1")
    with pytest.raises(EnvError, match=r"unknown env id 'ALE/Pongg-v5'\. Did you mean 'ALE/Pong-v5'\?"):
        check_env_id("ALE/Pongg-v5")
    with pytest.raises(EnvError, match=r"Did you mean 'MinAtar/Breakout-v1'\?"):
        check_env_id("MinAtar/Breakot-v1")


@pytest.mark.parametrize(
    "env_id, module, extra",
    [
        ("ALE/Pong-v5", "ale_py", "atari"),
        ("ALE/Pong-v5", "cv2", "atari"),
        ("MinAtar/Breakout-v1", "minatar.gym", "minatar"),
    ],
)
def test_missing_package_says_how_to_install_it(monkeypatch, env_id, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(EnvError, match=rf"pip install 'shoal\[{extra}\]'"):
        check_env_id(env_id)
    with pytest.raises(EnvError, match=rf"pip install 'shoal\[{extra}\]'"):
        config_creator(env_id)


def test_minatar_obs_and_render():
    env = config_creator("MinAtar/Breakout-v1")({"render_mode": "rgb_array"})
    assert env.observation_space.shape == (10, 10, 4) and env.observation_space.dtype == bool
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(0)
    assert obs.shape == (10, 10, 4) and obs.dtype == bool
    frame = env.render()
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8
    for row in range(10):
        for col in range(10):
            on = np.flatnonzero(obs[row, col])
            expected = PALETTE[on[-1]] if len(on) else [0, 0, 0]
            block = frame[row * 16 : (row + 1) * 16, col * 16 : (col + 1) * 16]
            assert (block == expected).all(), (row, col, on)
    assert obs.any(axis=-1).sum() > 0 and (frame == 0).all(axis=-1).any()
