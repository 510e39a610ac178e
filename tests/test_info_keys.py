"""info_keys: the step infos' values stored in the rollout at every step and reported as their
per-episode mean; what is not a number, and envs whose infos are not read, are refused."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.errors import ConfigError, EnvError

QUIET = dict(save_outputs=False, verbose=0, tuned=False, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16)


class InfoEnv(gym.Env):
    """Episodes of 4 steps; step t's info holds ``step`` = t (mean over an episode: 2.5), a
    ``success`` flag set on the last step only, and a string ``note``."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        info = {"step": self.t, "success": self.t == 4, "note": "text"}
        return np.zeros(1, np.float32), 0.0, self.t == 4, False, info


@pytest.mark.parametrize("workers", [0, 2], ids=["in process", "worker processes"])
def test_info_values_are_stored_every_step_and_averaged_per_episode(workers):
    keys = ["step", "success", "absent"]
    with shoal.PPO(env=InfoEnv, info_keys=keys, num_workers=workers, **QUIET) as trainer:
        result = trainer.train()
        info = trainer.algorithm.buffer.rollout["info"][:, :-1]
    assert info.shape == (2, 8, 3)
    assert info[:, :, 0].tolist() == [[1, 2, 3, 4, 1, 2, 3, 4]] * 2  # each step's own info
    assert info[:, :, 1].tolist() == [[0, 0, 0, 1, 0, 0, 0, 1]] * 2
    assert info[:, :, 2].isnan().all()  # absent from the info: nan, and no metric
    metrics = result["custom_metrics"]
    assert metrics["step_mean"] == 2.5  # the mean over the episode's steps, not the last step's 4
    assert metrics["success_mean"] == 0.25
    assert not any(name.startswith("absent") for name in metrics)


def test_an_info_value_that_is_not_a_number_is_refused_with_its_key():
    with (
        shoal.PPO(env=InfoEnv, info_keys=["note"], **QUIET) as trainer,
        pytest.raises(EnvError, match=r"info\['note'\] is 'text' \(str\); info_keys takes numbers"),
    ):
        trainer.train()


@pytest.mark.parametrize(
    ("env", "settings"),
    [
        ("pettingzoo:mpe2.simple_spread_v3", {}),
        ("CartPole-v1", {"vectorization_mode": "sync"}),
    ],
    ids=["multi-agent", "one vector"],
)
def test_envs_whose_step_infos_are_not_read_are_refused(env, settings):
    with pytest.raises(ConfigError, match=r"info_keys=\['x'\] reads the step infos of single-agent"):
        shoal.PPO(env=env, info_keys=["x"], **settings, **QUIET)


def test_a_resumed_run_keeps_the_running_sums_of_the_episodes_under_way(tmp_path):
    # 6 steps a row per iteration: the checkpoint falls 2 steps into each row's second episode
    settings = dict(QUIET, env=InfoEnv, info_keys=["step"], rollout_fragment_length=6, sgd_minibatch_size=12)
    with shoal.PPO(**settings | dict(save_outputs=True, run_dir=str(tmp_path))) as trainer:
        trainer.train()
        path = trainer.save()
    with shoal.Trainer.from_checkpoint(path, env=InfoEnv) as resumed:
        metrics = resumed.train()["custom_metrics"]
    # every episode's mean is 2.5; sums lost at the checkpoint would make the straddling one 3.5
    assert metrics["step_mean"] == metrics["step_min"] == metrics["step_max"] == 2.5
