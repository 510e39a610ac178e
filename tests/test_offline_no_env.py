"""Learning from datasets with no env given: the env the data was recorded on when this machine has
it, else no env at all (the datasets' spaces; estimates instead of evaluation episodes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import shoal
from shoal.cli import main
from shoal.config import BCConfig
from shoal.errors import ConfigError, EnvError
from shoal.train.recording import record_dataset

pytest.importorskip("h5py")
QUIET = dict(save_outputs=False, verbose=0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """CartPole steps of a short PPO run, and a copy that names no env this machine has (as a
    robot's logs would): ``(with_env, without_env)``."""
    root = tmp_path_factory.mktemp("datasets")
    with shoal.PPO(env="CartPole-v1", seed=1, num_envs=4, output=str(root / "cartpole"), **QUIET) as ppo:
        ppo.learn(1024)
    robot = root / "robot"
    for meta in sorted((root / "cartpole").rglob("metadata.json")):
        data = json.loads(meta.read_text())
        data.pop("env_spec")
        data["shoal_env"] = "ArmRig"
        target = robot / meta.relative_to(root / "cartpole")
        target.parent.mkdir(parents=True)
        target.write_text(json.dumps(data))
        (target.parent / "main_data.hdf5").write_bytes((meta.parent / "main_data.hdf5").read_bytes())
    return root / "cartpole", robot


def test_a_dataset_of_a_registered_env_evaluates_in_it(recorded):
    with_env, _ = recorded
    with shoal.BC(input=str(with_env), evaluation_interval=1, evaluation_num_episodes=2, **QUIET) as bc:
        assert bc.config.env == "CartPole-v1"
        result = bc.train()
    assert result["evaluation"]["episodes"] == 2


def test_with_no_env_the_datasets_spaces_train_and_estimates_replace_evaluation(recorded, tmp_path, capsys):
    _, robot = recorded
    run = tmp_path / "run"
    settings = ["input=" + str(robot), "total_timesteps=600", "evaluation_interval=1", f"run_dir={run}"]
    assert main(["train", "--algo", "bc", *settings, "off_policy_estimation_methods=[is, wis]", "verbose=0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["evaluation"] is None and set(summary["off_policy_estimation"]) == {"v_behaviour", "is", "wis"}
    assert yaml.safe_load((run / "config.yaml").read_text())["env"] is None
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "evaluation/episode_reward_mean" not in last  # no episode was played
    assert np.isfinite(last["evaluation/off_policy_estimation/wis"])
    assert np.isfinite(last["evaluation/off_policy_estimation/v_behaviour"])

    with shoal.BC.from_checkpoint(run, verbose=0) as bc:  # a saved run with no env loads with none
        assert bc.config.env is None and bc.env_name == "ArmRig"
        obs = np.zeros(4, dtype=np.float32)
        assert bc.compute_actions(obs[None], deterministic=True)[0] in (0, 1)
        with pytest.raises(ConfigError, match="no env to evaluate in: it learns from datasets recorded on 'ArmRig'"):
            bc.evaluate()
    with shoal.BC.from_checkpoint(run, env="CartPole-v1", verbose=0) as bc:  # ... or with the env to play
        assert bc.evaluate(2)["episodes"] == 2
    with pytest.raises(ConfigError, match="learned from datasets with no env \\(recorded on 'ArmRig'\\); recording"):
        record_dataset(run, tmp_path / "recorded", 2)
    assert not (tmp_path / "recorded").exists()


def test_no_env_needs_datasets(capsys):
    with pytest.raises(ConfigError, match="env=None: a run with no env learns from datasets only"):
        BCConfig.build(env=None)
    assert main(["train", "--algo", "dqn", "seed=1"]) != 0
    assert "or learn from datasets with input=DIR" in capsys.readouterr().err


@pytest.mark.slow
def test_a_replay_learner_with_no_env_refuses_to_act_in_one(recorded):
    _, robot = recorded
    with shoal.DQN(input=str(robot), learning_starts=100, train_freq=100, **QUIET) as dqn:
        dqn.train()
        assert dqn.config.env is None
        with pytest.raises(EnvError, match="this run has no env to step: it learns from datasets recorded on 'ArmRig'"):
            dqn.backend.send(None)
