"""Pixels through the trainer: uint8 frames in the rollout, rewards clipped for learning only,
whole games in the logs, evaluation on the raw env, videos of the real frames, and MinAtar
learning on a small budget. (The Atari wrappers themselves: tests/test_atari.py.)"""

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

import shoal
from shoal.envs.atari import EpisodicLife
from shoal.vector.build import build_backend
from tests.conftest import CounterEnv

SMALL = dict(
    num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=1, save_outputs=False, verbose=0
)


def _wrappers(env) -> list[type]:
    kinds = [type(env)]
    while hasattr(env, "env"):
        env = env.env
        kinds.append(type(env))
    return kinds


@pytest.mark.slow
def test_atari_frames_stay_uint8_and_learning_rewards_are_clipped_by_default():
    with shoal.PPO(env="ALE/Breakout-v5", model="cnn", seed=0, **SMALL) as algo:
        rollout = algo.algorithm.buffer.rollout
        obs = rollout["obs"]
        assert obs.dtype == torch.uint8 and obs.shape == (2, 17, 4, 84, 84)
        assert obs.element_size() * obs.numel() == 2 * 17 * 84 * 84 * 4  # a byte a pixel
        assert algo.collector.clip_rewards is True
        assert EpisodicLife in _wrappers(algo.backend.envs[0])
        # the raw game: no life-loss terminals
        evaluation_backend = build_backend(algo.config, 1, evaluation=True)
        assert EpisodicLife not in _wrappers(evaluation_backend.envs[0])
        evaluation_backend.close()
        result = algo.train()
        assert rollout["obs"][:, :-1].float().mean() > 0  # real frames were written
        assert set(rollout["reward"].unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert "episode_reward_mean" in result
    with shoal.PPO(env="ALE/Breakout-v5", model="cnn", clip_rewards=False, **SMALL) as algo:
        assert algo.collector.clip_rewards is False
    with pytest.raises(shoal.ConfigError, match="vectorization_mode='sync' would make 'ALE/Breakout-v5' without"):
        shoal.PPO(env="ALE/Breakout-v5", vectorization_mode="sync", **SMALL)


@pytest.mark.parametrize("clip,learned", [(True, 1.0), (2.0, 2.0)])
def test_clipped_rewards_reach_the_learner_while_returns_stay_raw(clip, learned):
    with shoal.PPO(
        env=lambda: CounterEnv(limit=4, reward=5.0),
        clip_rewards=clip,
        num_envs=2,
        rollout_fragment_length=8,
        sgd_minibatch_size=16,
        save_outputs=False,
        verbose=0,
    ) as algo:
        result = algo.train()
        assert algo.algorithm.buffer.rollout["reward"][:, :-1].unique().tolist() == [learned]
        evaluation = algo.evaluate(2)
    assert result["episode_reward_mean"] == 20.0  # 4 steps of the raw 5
    assert evaluation["episode_reward_mean"] == 20.0  # evaluation reports the raw score too


class LivesEnv(CounterEnv):
    """Games of 6 steps with a life lost at step 3: a learning terminal whose info says the
    episode continues, after which reset() goes on with the same game (as shoal's Atari wrapper)."""

    def __init__(self):
        super().__init__(limit=6, terminate=True)
        self.life_lost = False

    def reset(self, *, seed=None, options=None):
        if self.life_lost:
            self.life_lost = False
            return np.full(self.obs_shape, self.t, np.float32), {}
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == 3:
            self.life_lost = True
            return obs, reward, True, False, {"episode_continues": True}
        return obs, reward, terminated, truncated, info


def test_a_done_that_says_the_episode_continues_ends_learning_but_not_the_logged_episode():
    with shoal.PPO(
        env=LivesEnv, num_envs=2, rollout_fragment_length=12, sgd_minibatch_size=24, save_outputs=False, verbose=0
    ) as algo:
        result = algo.train()
        terminated = algo.algorithm.buffer.rollout["terminated"][0, :-1]
    assert terminated.nonzero().squeeze(1).tolist() == [2, 5, 8, 11]  # GAE stops at the lost life too
    assert (result["episode_reward_mean"], result["episode_len_mean"]) == (6.0, 6.0)
    assert result["episodes_this_iter"] == 4  # two whole episodes per env, not four lives


@pytest.mark.slow
def test_minatar_learns_on_a_small_budget_and_films_its_cells(tmp_path):
    """MinAtar Breakout with the small CNN: a random policy scores about 0.4 a game; 20k steps
    (about 8 s) bring the training return above 1.2."""
    with shoal.PPO(
        env="MinAtar/Breakout-v1",
        model="cnn",
        num_envs=16,
        rollout_fragment_length=64,
        sgd_minibatch_size=256,
        num_sgd_iter=4,
        learning_rate=1e-3,
        gamma=0.99,
        gae_lambda=0.95,
        ent_coef=0.01,
        seed=1,
        save_outputs=False,
        verbose=0,
    ) as algo:
        assert algo.algorithm.buffer.rollout["obs"].dtype == torch.bool
        conv = algo.get_policy().model.actor[0].net[0]
        assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (4, 16, (3, 3))  # MinAtar's own network
        result = algo.learn(20_480)
        assert result["episode_reward_mean"] >= 1.2, result["episode_reward_mean"]
        out = algo.evaluate(1, video_dir=tmp_path)
    frames = imageio.mimread(out["videos"][0])
    assert len(frames) == out["episode_len_mean"] + 1 and frames[0].shape == (160, 160, 3)
    assert len({tuple(c) for c in np.concatenate([f.reshape(-1, 3) for f in frames])}) > 2  # coloured cells
