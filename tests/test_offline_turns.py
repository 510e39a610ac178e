"""Offline data of turn-based games and of runs off the common path: a player's episode ends on the
move that ends the game (the loser's too), a masked env reads a dataset recorded without masks, a
killed writer is reported as such, ``~`` in folders is the home directory, a torchrun run's rank
folders read as one input, and the recorded env spec keeps the run's env_config."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

import shoal
from shoal.errors import OutputError
from shoal.offline import DatasetFile, dataset_folders
from shoal.offline.info import dataset_summary

h5py = pytest.importorskip("h5py")
QUIET = dict(save_outputs=False, verbose=0)
CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """Connect four played by one PPO policy for both players, written with ``output``."""
    out = tmp_path_factory.mktemp("games") / "data"
    with shoal.PPO(env=CONNECT_FOUR, seed=1, num_envs=4, output=str(out), **QUIET) as ppo:
        ppo.learn(3000)
    return out


def test_each_player_s_episode_ends_with_its_game(games):
    episodes = [ep for folder in dataset_folders(games) for ep in DatasetFile.open(folder).episodes()]
    ended = [ep for ep in episodes if ep.terminations[-1]]
    assert len(ended) >= 40
    for episode in episodes:
        assert len(episode) <= 21  # a player makes at most 21 of a game's 42 moves
        assert not (episode.terminations[:-1] | episode.truncations[:-1]).any()
    # every finished game gave one player +1 and the other -1 (a draw: 0 to both)
    outcomes = sorted(round(float(ep.rewards.sum())) for ep in ended)
    assert set(outcomes) <= {-1, 0, 1} and outcomes.count(-1) == outcomes.count(1) > 0


@pytest.mark.slow
def test_a_masked_env_reads_a_dataset_recorded_without_masks(games, tmp_path):
    bare = tmp_path / "bare"
    for folder in dataset_folders(games):
        target = bare / folder.relative_to(games)
        target.mkdir(parents=True)
        (target / "metadata.json").write_bytes((folder / "metadata.json").read_bytes())
        with h5py.File(folder / "main_data.hdf5") as src, h5py.File(target / "main_data.hdf5", "w") as dst:
            for name, group in src.items():
                src.copy(group, dst, name)
                del dst[f"{name}/infos/action_mask"]
    with shoal.DQN(env=CONNECT_FOUR, input=str(bare), learning_starts=64, train_freq=64, **QUIET) as dqn:
        result = dqn.train()
    assert result["replay_size"] >= 1000


def test_a_killed_writer_is_reported_as_killed(tmp_path):
    with shoal.PPO(env="CartPole-v1", output=str(tmp_path / "data"), **QUIET) as ppo:
        ppo.train()
        os.kill(ppo.dataset_writer.process.pid, signal.SIGKILL)
        ppo.dataset_writer.process.join()
        with pytest.raises(OutputError, match=r"its process ended early \(exit code -9\) without a report; was it"):
            ppo.train()


def test_folders_may_start_at_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with shoal.PPO(env="CartPole-v1", output="~/data", **QUIET) as ppo:
        ppo.train()
    assert dataset_folders(tmp_path / "data")
    settings = dict(learning_starts=100, gradient_steps=1)  # the data is read, not learned from: one gradient step
    with shoal.DQN(env="CartPole-v1", input="~/data", **settings, **QUIET) as dqn:
        assert dqn.train()["replay_size"] >= 1000


@pytest.mark.slow
def test_rank_folders_read_as_one_input_and_the_spec_keeps_env_config(tmp_path):
    out = tmp_path / "data"
    env_config = {"g": 3.0, "max_episode_steps": 50}
    with shoal.PPO(env="Pendulum-v1", env_config=env_config, output=str(out / "rank-0"), **QUIET) as ppo:
        ppo.train()
    shutil.copytree(out / "rank-0", out / "rank-1")  # as two torchrun ranks leave it
    (folder, _) = dataset_folders(out)
    spec = json.loads(json.loads((folder / "metadata.json").read_text())["env_spec"])
    assert spec["kwargs"]["g"] == 3.0 and spec["max_episode_steps"] == 50
    with shoal.BC(env="Pendulum-v1", input=str(out), **QUIET) as bc:
        assert bc.train()["timesteps_total"] > 0
    [summary] = dataset_summary(out)  # the ranks' shards summarized as their policy's
    assert summary["policy"] == "default_policy" and summary["shards"] == 2
