"""Datasets of Dict, Tuple and discrete observation spaces (as Minari's DataCollector records them,
one array per key) are read as the flat rows shoal's rollouts hold, in gymnasium's flatten layout."""

from __future__ import annotations

import shutil

import gymnasium as gym
import numpy as np
import pytest
from conftest import play_randomly

import shoal
from shoal.offline import DatasetError, DatasetFile, dataset_folders
from shoal.offline.structured import flatten_steps

minari = pytest.importorskip("minari")
QUIET = dict(save_outputs=False, verbose=0)

NESTED = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        "mode": gym.spaces.Discrete(3, start=1),
        "grid": gym.spaces.MultiDiscrete([2, 3]),
        "flags": gym.spaces.MultiBinary(2),
        "pair": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0.0, 1.0, (1,), np.float32))),
    }
)


def stacked(space, samples):
    """The samples of ``space`` batched as Minari stores them: per key, per tuple member."""
    if isinstance(space, gym.spaces.Dict):
        return {key: stacked(sub, [s[key] for s in samples]) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stacked(sub, [s[i] for s in samples]) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(s) for s in samples])


@pytest.mark.parametrize("space", [NESTED, gym.spaces.Discrete(4), gym.spaces.MultiDiscrete([[2, 2], [3, 1]])])
def test_an_episode_flattens_as_gymnasium_flattens_each_observation(space):
    space.seed(0)
    samples = [space.sample() for _ in range(7)]
    expected = np.stack([gym.spaces.flatten(space, s) for s in samples]).astype(np.float32)
    np.testing.assert_array_equal(flatten_steps(space, stacked(space, samples)), expected)


class DictCorridor(gym.Env):
    """Walk left or right on 5 cells toward a goal cell; the observation is a Dict of where the agent
    is (a Box) and which cell is the goal (a Discrete)."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {"at": gym.spaces.Box(0.0, 4.0, (1,), np.float32), "goal": gym.spaces.Discrete(5)}
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"at": np.array([self.at], np.float32), "goal": self.goal}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.at, self.goal, self.t = 2.0, int(self.np_random.choice([0, 4])), 0
        return self._obs(), {}

    def step(self, action):
        self.at = float(np.clip(self.at + (1 if action else -1), 0, 4))
        self.t += 1
        reached = self.at == self.goal
        return self._obs(), float(reached), reached, self.t >= 20 and not reached, {}


@pytest.fixture(scope="module")
def corridor_data(tmp_path_factory):
    """80 episodes of uniformly random play recorded by Minari's DataCollector."""
    pytest.importorskip("jax")  # what minari's DataCollector records with
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        env = minari.DataCollector(DictCorridor())
        play_randomly(env, 80)
        env.create_dataset(dataset_id="corridor/random-v0", algorithm_name="uniform random")
        loaded = minari.load_dataset("corridor/random-v0")
        episodes = list(loaded.iterate_episodes())
    return root / "corridor" / "random-v0", episodes


def test_a_dict_dataset_reads_as_the_env_s_flat_observations(corridor_data):
    folder, episodes = corridor_data
    (file,) = [DatasetFile.open(f) for f in dataset_folders(folder)]
    space = DictCorridor().observation_space
    for mine, theirs in zip(file.episodes(), episodes, strict=True):
        flat = [
            gym.spaces.flatten(space, {k: v[t] for k, v in theirs.observations.items()}) for t in range(len(mine) + 1)
        ]
        np.testing.assert_array_equal(mine.observations, np.stack(flat).astype(np.float32))
        np.testing.assert_array_equal(mine.actions, theirs.actions)


def test_a_dict_dataset_missing_a_key_is_refused_naming_the_field(corridor_data, tmp_path):
    h5py = pytest.importorskip("h5py")
    folder, _ = corridor_data
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    with h5py.File(copy / "data" / "main_data.hdf5", "r+") as f:
        del f["episode_3/observations/goal"]
    with pytest.raises(DatasetError, match=r"episode_3 field 'observations' does not hold its space: no member 'goal'"):
        list(DatasetFile.open(dataset_folders(copy)[0]).episodes())


@pytest.mark.slow
def test_dqn_learns_the_corridor_from_a_dict_dataset_with_and_without_the_env(corridor_data):
    folder, _ = corridor_data
    settings = dict(input=str(folder), seed=1, learning_starts=300, train_freq=100, gradient_steps=50, gamma=0.9)
    with shoal.DQN(env=DictCorridor, **settings, **QUIET) as dqn:
        dqn.learn(2500)
        assert dqn.evaluate(10)["episode_reward_mean"] == 1.0  # walks to the goal the observation names
    with shoal.DQN(**settings, **QUIET) as no_env:  # the env's class is not registered: the dataset's spaces
        no_env.learn(2500)
        assert no_env.config.env is None
        middle = [
            {"at": np.array([2.0], np.float32), "goal": goal} for goal in (0, 4)
        ]  # Dict observations, as the env's
        assert no_env.compute_actions(middle, deterministic=True).tolist() == [0, 1]
