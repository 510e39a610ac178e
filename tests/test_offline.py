"""Offline experience: ``output`` writes Minari datasets as the envs are stepped, ``input`` feeds
them to the replay learners in place of the envs, ``shoal dataset info`` summarizes them, and bad
data is refused with one message naming the file and the field."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import CounterEnv, play_randomly

import shoal
from shoal.cli import main
from shoal.errors import ConfigError, OutputError
from shoal.offline import DatasetFile, dataset_folders
from shoal.offline.info import dataset_summary
from shoal.offline.minari_files import DatasetError, EpisodeArrays, ShardWriter

h5py = pytest.importorskip("h5py")
minari = pytest.importorskip("minari")
QUIET = dict(save_outputs=False, verbose=0)


def record(tmp_path, steps=400, **settings):
    """A PPO run writing its steps to ``tmp_path / 'data'``; returns the folder."""
    out = tmp_path / "data"
    keys = dict(env="CartPole-v1", seed=1, num_envs=4, save_outputs=False, verbose=0, output=str(out)) | settings
    with shoal.PPO(**keys) as algo:
        algo.learn(steps)
    return out


@pytest.fixture(scope="module")
def short_record(tmp_path_factory):
    """``record(steps=512)``, run once: the tests that only read or damage such a dataset take a
    copy (``copy_of``) instead of recording the same steps again."""
    return record(tmp_path_factory.mktemp("short_record"), steps=512)


def copy_of(folder, tmp_path):
    """A copy of the dataset ``folder`` as ``tmp_path / 'data'``, as ``record`` would have left it."""
    return shutil.copytree(folder, tmp_path / "data")


def record_counter(tmp_path, make, steps):
    """A PPO run on 2 copies of a counting env (``make()``) writing ``tmp_path / 'data'``."""
    out = tmp_path / "data"
    with shoal.PPO(env=lambda: make(), num_envs=2, sgd_minibatch_size=64, seed=1, output=str(out), **QUIET) as algo:
        algo.learn(steps)
    return out


def episodes_of(folder):
    return [ep for f in dataset_folders(folder) for ep in DatasetFile.open(f).episodes()]


def test_a_run_s_output_is_a_minari_dataset_that_minari_loads(tmp_path, monkeypatch):
    out = record(tmp_path, steps=2048)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out))
    dataset = minari.load_dataset("default_policy/part-00000-v0")
    assert dataset.total_steps == 2048  # every step, the episodes under way at the end cut as truncations
    assert dataset.observation_space == shoal.PPO(env="CartPole-v1", save_outputs=False).backend.obs_spec.space
    for episode in dataset.iterate_episodes():
        n = len(episode.rewards)
        assert episode.observations.shape == (n + 1, 4) and episode.actions.shape == (n,)
        assert (episode.rewards == 1.0).all() and n <= 500
        assert not (episode.terminations[:-1] | episode.truncations[:-1]).any()  # ends only at the last step
        assert episode.terminations[-1] != episode.truncations[-1]
        logp = episode.infos["action_log_prob"]
        assert logp.shape == (n + 1,) and (logp[:-1] <= 0).all() and np.isnan(logp[-1])


def test_a_truncated_episode_keeps_its_true_final_observation(tmp_path):
    out = record_counter(tmp_path, CounterEnv, 64)
    episodes = episodes_of(out)
    whole = [ep for ep in episodes if len(ep) == 5]
    assert len(whole) >= 12
    for ep in whole:  # obs counts the steps: 0..5, the last one from the truncation, not the next reset's 0
        assert ep.observations[:, 0].tolist() == [0, 1, 2, 3, 4, 5]
        assert ep.truncations.tolist() == [False] * 4 + [True]


def test_a_terminal_observation_is_zeros_and_said_so(tmp_path):
    """The envs do not keep a terminal step's observation (no learner reads it)."""
    out = record_counter(tmp_path, lambda: CounterEnv(terminate=True), 64)
    ep = next(ep for ep in episodes_of(out) if len(ep) == 5)
    assert ep.observations[:, 0].tolist() == [0, 1, 2, 3, 4, 0]
    assert ep.terminations[-1] and not ep.truncations.any()


def test_worker_processes_and_several_policies_write_one_dataset_per_policy(tmp_path):
    out = tmp_path / "data"
    settings = dict(
        env="pettingzoo:mpe2.simple_spread_v3",
        env_config={"max_cycles": 10},
        num_envs=2,
        num_workers=2,
        policies=["agent_0", "rest"],
        policy_mapping_fn={"agent_0": "agent_0", "agent_1": "rest", "agent_2": "rest"},
        seed=1,
        save_outputs=False,
        verbose=0,
        output=str(out),
    )
    with shoal.PPO(**settings) as algo:
        algo.learn(200)
        summary = algo.dataset_writer.close()
    assert sorted(p.name for p in out.iterdir()) == ["agent_0", "rest"]
    assert summary["rest"]["steps"] == 2 * summary["agent_0"]["steps"] > 0  # two agents' episodes to one's
    for ep in episodes_of(out / "agent_0"):
        assert len(ep) == 10 and ep.truncations[-1]


def test_shards_rotate_and_an_unfinished_one_is_never_read(tmp_path):
    out = record(tmp_path, steps=4096, output_max_file_size=1 << 16)
    shards = dataset_folders(out)
    assert len(shards) >= 3
    assert sum(DatasetFile.open(f).total_steps for f in shards) == 4096
    hidden = out / "default_policy" / ".part-x1b2.tmp" / "data"  # a writer that died half way
    shutil.copytree(shards[0], hidden)
    (hidden / "main_data.hdf5").write_bytes(b"half")
    assert dataset_folders(out) == shards


def test_writers_sharing_a_folder_each_take_a_shard_name_of_their_own(tmp_path, monkeypatch):
    env = gym.make("CartPole-v1")
    folder = tmp_path / "d" / "default_policy"
    first, second = (ShardWriter(folder, env.observation_space, env.action_space) for _ in range(2))
    for steps, shard in ((3, first), (5, second)):
        episode = EpisodeArrays(
            np.zeros((steps + 1, 4), np.float32),
            np.zeros(steps, np.int64),
            np.ones(steps),
            np.eye(steps, dtype=bool)[-1],
            np.zeros(steps, bool),
        )
        shard.add(episode)
    assert second.close().name == "part-00000-v0"
    with monkeypatch.context() as m:  # another writer takes part-00000 between the listing and the claim
        m.setattr(type(folder), "glob", lambda self, pattern: iter(()))
        assert first.close().name == "part-00001-v0"
    shards = dataset_folders(tmp_path / "d")
    assert [DatasetFile.open(f).total_steps for f in shards] == [5, 3]
    ids = [DatasetFile.open(f).metadata["dataset_id"] for f in shards]
    assert ids == ["default_policy/part-00000-v0", "default_policy/part-00001-v0"]


def test_a_refused_write_ends_the_run_with_one_message_and_whole_shards(tmp_path, monkeypatch):
    calls = {"n": 0}
    add = ShardWriter.add

    def full_disk(self, episode):
        calls["n"] += 1
        if calls["n"] > 40:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.tmp))
        add(self, episode)

    monkeypatch.setattr(ShardWriter, "add", full_disk)  # the writer process is forked: it has this too
    out = tmp_path / "data"
    algo = shoal.PPO(env="CartPole-v1", num_envs=4, seed=1, save_outputs=False, verbose=0, output=str(out))
    algo.config.output_max_file_size = 1 << 16
    with pytest.raises(OutputError, match=r"could not write the dataset .*No space left on device.* free there now"):
        algo.learn(50_000)
    algo.close()  # the error was said once
    for folder in dataset_folders(out):  # what was closed reads whole
        assert len(list(DatasetFile.open(folder).episodes())) == DatasetFile.open(folder).total_episodes
    assert not list((out / "default_policy").glob(".*"))  # the shard under way is gone


def test_dataset_info_prints_each_policy_s_counts_and_returns(tmp_path, capsys):
    out = record(tmp_path, steps=1024)
    assert main(["dataset", "info", str(out), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["policy"] == "default_policy" and row["steps"] == 1024
    assert row["action_space"] == "Discrete(2)" and row["observation_space"] == "Box(4,) float32"
    assert row["return_mean"] == pytest.approx(row["length_mean"])  # CartPole pays 1 per step
    assert main(["dataset", "info", str(tmp_path / "nothing")]) == 2
    assert "holds no dataset" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_learners_read_a_dataset_in_place_of_the_envs(tmp_path):
    out = record(tmp_path, steps=2048)
    with shoal.DQN(
        env="CartPole-v1", input=str(out), seed=1, save_outputs=False, verbose=0, learning_starts=100
    ) as dqn:
        result = dqn.learn(3000)
    assert result["replay_size"] == result["timesteps_total"] >= 3000  # the dataset, read again once it ran out
    assert result["num_gradient_steps"] > 0
    assert result["episodes_total"] == 0  # no env episode was played


def test_the_reader_plays_episodes_back_exactly(tmp_path):
    out = record_counter(tmp_path, CounterEnv, 40)
    bc = shoal.BC(env=lambda: CounterEnv(), input=str(out), seed=1, save_outputs=False, verbose=0, train_freq=7)
    rollout = bc.algorithm.rollout.start_rollout()
    bc.collector.collect(rollout)
    obs, first = rollout["obs"][0, :, 0].tolist(), rollout["first"][0].tolist()
    assert obs == [0, 1, 2, 3, 4, 0, 1, 2]  # an episode, then the next from its start
    assert first == [True, False, False, False, False, True, False, False]
    assert rollout["truncated"][0, 4] and not rollout["terminated"][0].any()
    cut = bc.collector.truncations
    assert cut.row.tolist() == [0] and cut.step.tolist() == [4] and cut.obs[:, 0].tolist() == [5.0]
    bc.close()


@pytest.mark.slow  # a learning run
def test_bc_learns_cartpole_from_a_ppo_run_s_steps(tmp_path):
    out = record(tmp_path, steps=30_000, num_envs=8)
    with shoal.BC(env="CartPole-v1", input=str(out), seed=1, save_outputs=False, verbose=0) as bc:
        result = bc.learn(20_000)
        score = bc.evaluate(10)["episode_reward_mean"]
    assert result["loss"] < 0.6
    assert score >= 150, score


# ----- bad data: one message naming the file and the field, nothing written over -----------------
def test_input_refuses_what_it_cannot_read(tmp_path, short_record):
    out = copy_of(short_record, tmp_path)
    shard = dataset_folders(out)[0]
    settings = dict(seed=1, save_outputs=False, verbose=0)
    with pytest.raises(
        DatasetError, match=r"field 'observation_space' is Box\(.*\); env 'Pendulum-v1' has Box\(.*\(3,\)"
    ):
        shoal.BC(env="Pendulum-v1", input=str(out), **settings)
    with pytest.raises(DatasetError, match="does not exist"):
        shoal.BC(env="CartPole-v1", input=str(tmp_path / "nope"), **settings)
    empty = tmp_path / "empty" / "data"
    empty.mkdir(parents=True)
    meta = json.loads((shard / "metadata.json").read_text()) | {"total_steps": 0, "total_episodes": 0}
    (empty / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="holds no steps"):
        shoal.BC(env="CartPole-v1", input=str(empty.parent), **settings)
    with pytest.raises(ConfigError, match="PPO learns from its own policy's steps"):
        shoal.PPO(env="CartPole-v1", input=str(out), **settings)
    with pytest.raises(ConfigError, match="BC learns from recorded steps only"):
        shoal.BC(env="CartPole-v1", **settings)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("drop_rewards", r"episode_0 has no field 'rewards'"),
        ("nan_obs", r"episode_0: field 'observations' holds \[ *nan .* at step 0"),
        ("short_actions", r"field 'actions' has \d+ rows, 'rewards' \d+"),
        ("truncate_file", r"cannot be read as HDF5 \(truncated or not HDF5\?\)"),
        ("action_7", r"episode_0: field 'actions' holds 7 at step 2, outside Discrete\(2\)"),
        ("wide_obs", r"episode_0: field 'observations' has rows of shape \(5,\); env 'CartPole-v1' observes \(4,\)"),
    ],
)
def test_a_damaged_dataset_is_refused_naming_the_file_and_the_field(tmp_path, short_record, damage, message):
    out = copy_of(short_record, tmp_path)
    path = dataset_folders(out)[0] / "main_data.hdf5"
    if damage == "truncate_file":
        path.write_bytes(path.read_bytes()[:2000])
    else:
        with h5py.File(path, "a") as f:
            group = f["episode_0"]
            if damage == "drop_rewards":
                del group["rewards"]
            elif damage == "nan_obs":
                group["observations"][0, 0] = np.nan
            elif damage == "action_7":
                group["actions"][2] = 7
            elif damage == "wide_obs":
                obs = group["observations"][()]
                del group["observations"]
                group["observations"] = np.concatenate([obs, obs[:, :1]], axis=1)
            else:
                actions = group["actions"][()]
                del group["actions"]
                group["actions"] = actions[:-1]
    before = path.read_bytes()
    with pytest.raises(DatasetError, match=message), shoal.BC(env="CartPole-v1", input=str(out), seed=1, **QUIET) as bc:
        bc.learn(2000)
    assert path.read_bytes() == before  # reading writes nothing


def test_a_bad_input_or_output_key_is_one_config_error():
    with pytest.raises(ConfigError, match="mixing weight > 0"):
        shoal.BC(env="CartPole-v1", input={"a": 0}, save_outputs=False)
    with pytest.raises(ConfigError, match="neither 'sampler'"):
        shoal.DQN(env="CartPole-v1", input=3, save_outputs=False)
    with pytest.raises(ConfigError, match="output=.* writes what the envs give"):
        shoal.DQN(env="CartPole-v1", input="x", output="y", save_outputs=False)


@pytest.mark.slow
def test_a_dataset_made_by_minari_s_data_collector_trains_in_shoal(tmp_path, monkeypatch):
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("jax")  # what minari's DataCollector records with
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = minari.DataCollector(gym.make("CartPole-v1"))
    play_randomly(env, 30)
    made = env.create_dataset(dataset_id="cartpole/random-v0", algorithm_name="uniform random", eval_env="CartPole-v1")
    with shoal.DQN(
        env="CartPole-v1", input=str(tmp_path / "cartpole" / "random-v0"), seed=1, learning_starts=100, **QUIET
    ) as dqn:
        result = dqn.learn(1000)
    assert result["replay_size"] >= 1000 and made.total_steps > 300
    (row,) = dataset_summary(tmp_path / "cartpole" / "random-v0")
    assert row["episodes"] == 30 and row["steps"] == made.total_steps


@pytest.mark.slow
def test_ray_rollout_workers_write_the_same_dataset(ray_cluster, tmp_path):
    out = tmp_path / "data"
    with shoal.PPO(env="CartPole-v1", backend="ray", num_workers=2, seed=1, output=str(out), **QUIET) as algo:
        algo.learn(1024)
        written = algo.dataset_writer.close()
    assert written["default_policy"]["steps"] == algo.timesteps_total
    assert sum(len(ep) for ep in episodes_of(out)) == algo.timesteps_total


@pytest.mark.slow
def test_a_dataset_larger_than_the_buffer_trains_through_it(tmp_path):
    out = record(tmp_path, steps=2048)
    settings = dict(buffer_size=500, train_freq=100, learning_starts=200)
    with shoal.BC(env="CartPole-v1", input=str(out), **settings, **QUIET) as bc:
        result = bc.learn(3000)
    assert result["replay_size"] <= 500 < 2048 and result["num_gradient_steps"] > 0  # never the whole dataset


@pytest.mark.slow  # a learning run
def test_bc_imitates_box_actions(tmp_path):
    """Recorded actions a = 0.5 * target on a one-step task: BC's mean action follows."""
    from conftest import TargetEnv

    env = TargetEnv()
    shard = ShardWriter(tmp_path / "d" / "default_policy", env.observation_space, env.action_space)
    rng = np.random.default_rng(0)
    for _ in range(500):
        target = rng.uniform(-1, 1, 1).astype(np.float32)
        action = 0.5 * target
        episode = EpisodeArrays(
            np.stack([target, target]), action[None], np.zeros(1), np.ones(1, bool), np.zeros(1, bool)
        )
        shard.add(episode)
    shard.close()
    settings = dict(seed=1, learning_rate=3e-3, train_freq=500, gradient_steps=200, learning_starts=500)
    with shoal.BC(env=TargetEnv, input=str(tmp_path / "d"), **settings, **QUIET) as bc:
        bc.learn(5000)
        obs = np.array([[-0.8], [0.0], [0.6]], dtype=np.float32)
        actions = bc.compute_actions(obs, deterministic=True)
    assert actions[:, 0] == pytest.approx([-0.4, 0.0, 0.3], abs=0.08)


def test_next_step_autoreset_envs_write_whole_episodes(tmp_path):
    """gymnasium's vector CartPole resets on the step after an episode's end (a step that is not a
    transition): every written episode starts from a reset and ends at its one done step."""
    out = record(tmp_path, steps=4096, vectorization_mode="vector_entry_point", num_envs=16)
    episodes = episodes_of(out)
    assert sum(len(ep) for ep in episodes) > 3500
    for ep in episodes:
        assert np.abs(ep.observations[0]).max() <= 0.05  # CartPole starts within 0.05 of upright and still
        assert (ep.rewards == 1).all() and not (ep.terminations[:-1] | ep.truncations[:-1]).any()
        if ep.terminations[-1]:
            assert np.abs(ep.observations[-1]).max() > 0  # the true last observation, where it fell


def test_a_second_run_into_the_same_output_adds_shards_after_the_first_s(tmp_path):
    out = record(tmp_path, steps=512)
    record(tmp_path, steps=512, seed=2)
    shards = dataset_folders(out)
    assert [f.parent.name for f in shards] == ["part-00000-v0", "part-00001-v0"]
    assert sum(DatasetFile.open(f).total_steps for f in shards) == 1024


def test_an_episode_spanning_many_rollouts_keeps_only_its_own_steps():
    from shoal.offline.episodes import Block, EpisodeAssembler
    from shoal.offline.writer import WriterSettings

    env = gym.make("CartPole-v1")
    settings = WriterSettings(Path("."), ("p",), ("p",), env.observation_space, env.action_space, (), 1 << 20, {})
    assembler = EpisodeAssembler(settings)
    rows, horizon = 8, 16
    blocks = []
    for k in range(5):  # row 0 plays one long episode; the other rows end one every block
        fields = {
            "obs": np.full((rows, horizon + 1, 4), k, np.float32),
            "action": np.zeros((rows, horizon + 1), np.int64),
            "reward": np.ones((rows, horizon + 1), np.float32),
            "terminated": np.zeros((rows, horizon + 1), bool),
            "truncated": np.zeros((rows, horizon + 1), bool),
            "first": np.zeros((rows, horizon + 1), bool),
            "valid": np.ones((rows, horizon + 1), bool),
            "policy_id": np.zeros((rows, horizon + 1), np.int64),
        }
        fields["terminated"][1:, horizon - 1] = True
        fields["first"][:, 0] = k == 0
        empty = np.zeros(0, np.int64)
        blocks.append(Block(fields, empty, empty, fields["obs"][:0, 0], next_step=False))
        assert len(assembler.add(blocks[-1])) == rows - 1
    pieces = assembler.open[0]
    assert len(pieces) == 5
    for piece, block in zip(pieces, blocks):
        assert not any(np.shares_memory(piece.fields[key], block.fields[key]) for key in block.fields)
        assert not np.shares_memory(piece.after, block.fields["obs"])
        assert piece.fields["obs"].shape == (horizon, 4)
    [(pid, row, episode)] = assembler.flush()
    assert (pid, row, len(episode)) == ("p", 0, 5 * horizon) and episode.truncations[-1]
    assert (episode.observations[-1] == 4).all()  # the observation after the last step collected


def test_an_arrow_dataset_is_read_in_the_order_asked_for(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    pytest.importorskip("jax")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = minari.DataCollector(gym.make("CartPole-v1"), data_format="arrow")
    play_randomly(env, 6)
    made = env.create_dataset(dataset_id="cartpole/arrow-v0", algorithm_name="uniform random")
    lengths = [len(ep.rewards) for ep in made.iterate_episodes()]
    (folder,) = dataset_folders(tmp_path / "cartpole" / "arrow-v0")
    file = DatasetFile.open(folder)
    assert file.metadata["data_format"] == "arrow"
    order = [4, 0, 5, 2]
    assert [len(ep) for ep in file.episodes(order)] == [lengths[k] for k in order]
    assert [len(ep) for ep in file.episodes()] == lengths


def test_the_dataset_holds_the_env_s_rewards_not_the_learner_s_scaled_ones(tmp_path):
    out = record(tmp_path, steps=2048, normalize_reward=True, clip_rewards=0.5)
    episodes = episodes_of(out)
    assert len(episodes) > 10
    for ep in episodes:
        assert (ep.rewards == 1.0).all()  # CartPole's reward, every step


@pytest.mark.parametrize("normalize", [False, True])
def test_the_dataset_holds_box_actions_as_the_env_took_them(tmp_path, normalize):
    out = record(tmp_path, steps=1024, env="Pendulum-v1", sgd_minibatch_size=256, normalize_actions=normalize)
    actions = np.concatenate([ep.actions for ep in episodes_of(out)])
    assert np.abs(actions).max() <= 2.0  # Pendulum's bounds: clipped (or rescaled from [-1, 1]) as sent
    assert np.abs(actions).max() > 1.5  # in the env's units, not the policy's unit range
    # a learner acting in [-1, 1] reads them back in its own units
    with shoal.BC(env="Pendulum-v1", input=str(out), normalize_actions=True, train_freq=200, **QUIET) as bc:
        rollout = bc.algorithm.rollout.start_rollout()
        bc.collector.collect(rollout)
        read = rollout["action"][rollout["valid"]]
    assert read.abs().max() <= 1.0 and read.abs().max() > 0.75


def test_box_actions_outside_the_env_s_bounds_are_refused_naming_the_step(tmp_path):
    env = gym.make("Pendulum-v1")
    shard = ShardWriter(tmp_path / "d" / "default_policy", env.observation_space, env.action_space)
    actions = np.zeros((3, 1), np.float32)
    actions[1] = 5.0
    shard.add(
        EpisodeArrays(np.zeros((4, 3), np.float32), actions, np.zeros(3), np.eye(3, dtype=bool)[-1], np.zeros(3, bool))
    )
    shard.close()
    with (
        pytest.raises(DatasetError, match=r"episode_0: field 'actions' holds \[5.\] at step 1, outside the bounds"),
        shoal.BC(env="Pendulum-v1", input=str(tmp_path / "d"), train_freq=3, **QUIET) as bc,
    ):
        bc.train()


@pytest.mark.slow
def test_a_run_never_closed_still_finishes_its_dataset(tmp_path):
    out = str(tmp_path / "d")
    script = f"import shoal\nshoal.PPO(env='CartPole-v1', num_envs=2, save_outputs=False, output={out!r}).learn(512)\n"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    (shard,) = dataset_folders(tmp_path / "d")
    assert DatasetFile.open(shard).total_steps == 512


def test_a_pass_interleaves_the_episodes_of_every_shard(tmp_path):
    from shoal.offline.reader import Source

    env = gym.make("CartPole-v1")
    folder = tmp_path / "d" / "default_policy"
    for steps in (1, 2):  # shard 0: one-step episodes, shard 1: two-step ones
        shard = ShardWriter(folder, env.observation_space, env.action_space)
        for _ in range(20):
            shard.add(
                EpisodeArrays(
                    np.zeros((steps + 1, 4), np.float32),
                    np.zeros(steps, np.int64),
                    np.ones(steps),
                    np.eye(steps, dtype=bool)[-1],
                    np.zeros(steps, bool),
                )
            )
        shard.close()
    files = [DatasetFile.open(f) for f in dataset_folders(tmp_path / "d")]
    stream = Source(tmp_path / "d", files, 1.0).episodes(np.random.default_rng(0))
    first_pass = [len(next(stream)[1]) for _ in range(40)]
    assert sorted(first_pass) == [1] * 20 + [2] * 20  # every episode once per pass
    assert set(first_pass[:10]) == {1, 2}  # both shards from the start


def test_info_of_a_dataset_with_no_episodes_says_n_a_for_its_returns(tmp_path, capsys):
    env = gym.make("CartPole-v1")
    ShardWriter(tmp_path / "d" / "default_policy", env.observation_space, env.action_space).close()
    assert main(["dataset", "info", str(tmp_path / "d"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["episodes"] == 0 and row["return_mean"] is None and row["length_mean"] is None
    assert main(["dataset", "info", str(tmp_path / "d")]) == 0
    assert "n/a" in capsys.readouterr().out


def test_rows_acting_in_a_block_leave_out_its_last_slot_and_absent_rows_are_passed_over():
    from shoal.offline.episodes import Block, EpisodeQuota, acting

    valid = np.zeros((3, 5), bool)
    valid[:, -1] = True  # the rollout's last slot starts the next one: it is no step of this block
    valid[0, :2] = valid[2, 1:4] = True
    empty = np.zeros(0, np.int64)
    block = Block({"valid": valid}, empty, empty, np.zeros((0, 1)), next_step=False)
    assert acting(block).tolist() == [0, 2]

    quota = EpisodeQuota(2, ["p"])
    one = EpisodeArrays(np.zeros((2, 1)), np.zeros(1), np.ones(1), np.ones(1, bool), np.zeros(1, bool))
    assert len(quota.offer([("p", 0, one), ("p", 1, one)], np.array([0, 1, 2]))) == 2  # row 2 is under way
    assert quota.counts["p"] == 2 and quota.full
    quota = EpisodeQuota(2, ["p"])
    assert len(quota.offer([("p", 0, one)], np.array([0, 1]))) == 1  # waits for row 1, which acts
    assert len(quota.offer([("p", 0, one)], np.array([0]))) == 1  # row 1 is gone: passed over
    quota = EpisodeQuota(1, ["p"])
    quota.offer([("p", 0, one)] * 50, np.array([0, 1]))
    assert len(quota.waiting[0]) <= 1  # a row's episodes past what a policy can take are not kept


def test_a_writer_stuck_at_close_is_stopped_after_the_timeout(tmp_path):
    algo = shoal.PPO(env="CartPole-v1", num_envs=2, output=str(tmp_path / "d"), **QUIET)
    try:
        algo.learn(128)
        writer = algo.dataset_writer
        os.kill(writer.process.pid, signal.SIGSTOP)  # as a writer blocked on a hung disk
        with pytest.raises(OutputError, match=r"had not finished after 1 s and was stopped"):
            writer.close(timeout=1.0)
        assert not writer.process.is_alive()
    finally:
        algo.close()


def test_shards_have_the_umask_s_permissions(tmp_path):
    env = gym.make("CartPole-v1")
    old = os.umask(0o022)
    try:
        shard = ShardWriter(tmp_path / "d" / "p", env.observation_space, env.action_space).close()
    finally:
        os.umask(old)
    assert shard.stat().st_mode & 0o777 == 0o755


def test_a_bad_estimation_dataset_stops_the_run_before_it_writes_and_input_names_folders_once(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        shoal.DQN(
            env="CartPole-v1",
            output=str(tmp_path / "out"),
            off_policy_estimation_input=str(tmp_path / "nowhere"),
            off_policy_estimation_methods=["dm"],
            evaluation_interval=1,
            **QUIET,
        )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"input names one folder more than once: \['./d', 'd'\]"):
        shoal.BC(env="CartPole-v1", input={"d": 1, "./d": 2}, **QUIET)
