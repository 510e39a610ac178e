"""Collection phases counted in episodes (`train_freq=[1, "episode"]`, rl-baselines3-zoo's TD3
settings): each phase ends where every env has ended an episode, the policy holds still through it,
the buffer stores no padding, and the config refuses what cannot be paced that way."""

import itertools

import gymnasium as gym
import pytest
import torch

import shoal
from shoal.config import DQNConfig, TD3Config
from shoal.errors import ConfigError

QUIET = dict(save_outputs=False, verbose=0)


class PhaseLog(shoal.Callback):
    """What each collection phase held: its steps' done flags and valid mask, and the policy's weights."""

    def __init__(self):
        self.phases = []

    def on_postprocess_trajectory(self, trainer, trajectory):
        rollout, mask = trajectory.rollout, trajectory.mask
        weights = torch.cat([p.detach().flatten() for p in trainer.get_policy().parameters()]).clone()
        self.phases.append((rollout["done"][:, :-1][mask].clone(), int(mask.sum()), weights))


def test_a_phase_is_one_whole_episode_and_learns_as_many_steps():
    log = PhaseLog()
    settings = dict(train_freq=[1, "episode"], gradient_steps=-1, learning_starts=0, timesteps_per_iteration=300)
    with shoal.DQN(env="CartPole-v1", seed=3, callbacks=[log], sgd_minibatch_size=16, **settings, **QUIET) as dqn:
        result = dqn.train()
        replay = dqn.algorithm.replay
        # each phase's steps are one episode: done exactly at its last step
        assert all(done[-1] and not done[:-1].any() for done, _, _ in log.phases)
        assert sum(steps for _, steps, _ in log.phases) == result["timesteps_total"] >= 300
        assert result["episodes_this_iter"] == len(log.phases)
        # as many minibatch steps as env steps (gradient_steps=-1), and the buffer holds no padding
        assert result["num_gradient_steps"] == result["timesteps_total"]
        assert len(replay) == result["timesteps_total"] and int(replay.sampleable.sum()) == len(replay)
    # learning follows every episode: no two phases end with the same weights
    weights = [w for _, _, w in log.phases]
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(weights))


def test_every_env_ends_an_episode_before_the_phase_ends():
    """With several envs a phase waits for the slowest env's first episode; the envs that ended
    theirs sooner go on into their next one, and those steps are stored too."""
    log = PhaseLog()
    with shoal.DQN(env="CartPole-v1", num_envs=3, seed=1, callbacks=[log], train_freq=[1, "episode"], **QUIET) as dqn:
        dqn.train()
    for done, steps, _ in log.phases:
        assert done.sum() >= 3 and steps % 3 == 0


def test_the_zoo_pair_and_its_errors():
    assert TD3Config.build(env="Pendulum-v1", train_freq=[1, "episode"]).train_freq_unit == "episode"
    assert TD3Config.build(env="Pendulum-v1", train_freq=[1, "episode"]).rollout_capacity == 200  # the time limit
    assert TD3Config.build(env="Pendulum-v1", train_freq=[8, "step"]).rollout_fragment_length == 8
    assert DQNConfig.build(train_freq_unit="episode", horizon=50).rollout_capacity == 50
    with pytest.raises(ConfigError, match=r"train_freq=\[2, 'episode'\]: a collection phase plays one episode"):
        DQNConfig.build(train_freq=[2, "episode"])
    with pytest.raises(ConfigError, match=r"train_freq=\[1, 'episodes'\]: give a step count, or a pair"):
        DQNConfig.build(train_freq=[1, "episodes"])
    with pytest.raises(ConfigError, match=r"play an episode per env, and rollout_fragment_length=16 counts steps"):
        DQNConfig.build(train_freq=[1, "episode"], rollout_fragment_length=16)
    saved = TD3Config.build(env="Pendulum-v1", train_freq=[1, "episode"]).settings()  # as config.yaml holds it
    assert TD3Config.build(**saved).rollout_capacity == 200
    with pytest.raises(ConfigError, match=r"and train_freq_unit='step' disagree"):
        DQNConfig.build(train_freq=[1, "episode"], train_freq_unit="step")
    with pytest.raises(ConfigError, match="a dataset \\(input\\) is read in phases of steps"):
        DQNConfig.build(train_freq_unit="episode", input="runs/some-dataset")
    with pytest.raises(ConfigError, match="sequence replay"):
        DQNConfig.build(train_freq_unit="episode", model_config={"core": "lstm"})


def test_an_env_without_a_step_limit_needs_a_horizon():
    gym.register("EndlessCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        with pytest.raises(ConfigError, match="env 'EndlessCartPole-v0' declares no step limit; set horizon=N"):
            DQNConfig.build(env="EndlessCartPole-v0", train_freq_unit="episode")
        assert DQNConfig.build(env="EndlessCartPole-v0", train_freq_unit="episode", horizon=300).rollout_capacity == 300
    finally:
        del gym.registry["EndlessCartPole-v0"]
