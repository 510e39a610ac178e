"""PPO end to end: it learns, it reports, it writes its run directory."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.cli import main
from tests.conftest import TargetEnv

RESULT_KEYS = {
    "episode_reward_mean",
    "episode_reward_min",
    "episode_reward_max",
    "episode_len_mean",
    "episodes_this_iter",
    "timesteps_total",
    "sps",
    "policy_loss",
    "vf_loss",
    "entropy",
    "approx_kl",
    "clipfrac",
    "explained_variance",
    "sample_time_ms",
    "learn_time_ms",
}


@pytest.mark.slow
def test_cartpole_defaults_learn_on_a_small_budget():
    algo = shoal.PPO(env="CartPole-v1", seed=1, save_outputs=False, verbose=0)
    result = algo.learn(40_000)
    assert result["timesteps_total"] >= 40_000
    evaluation = algo.evaluate(20)
    assert evaluation["episode_reward_mean"] >= 300, evaluation


@pytest.mark.slow
def test_numpy_vectorized_cartpole_learns():
    algo = shoal.PPO(
        env="CartPole-v1",
        vectorization_mode="vector_entry_point",
        num_envs=64,
        rollout_fragment_length=16,
        sgd_minibatch_size=256,
        num_sgd_iter=10,
        seed=3,
        save_outputs=False,
        verbose=0,
    )
    algo.learn(60_000)
    assert algo.evaluate(10)["episode_reward_mean"] >= 200


@pytest.mark.slow
def test_continuous_ppo_learns_a_target():
    algo = shoal.PPO(
        env=TargetEnv,
        num_envs=8,
        rollout_fragment_length=64,
        sgd_minibatch_size=128,
        num_sgd_iter=10,
        learning_rate=3e-3,
        lr_schedule="constant",
        seed=0,
        save_outputs=False,
        verbose=0,
    )
    first = algo.train()["episode_reward_mean"]
    algo.learn(20_000)
    ev = algo.evaluate(50)
    assert first < -0.3 and ev["episode_reward_mean"] > -0.05, (first, ev)


def test_result_has_rllib_keys_and_compute_actions(tmp_path):
    algo = shoal.PPO(
        env="CartPole-v1",
        seed=0,
        run_dir=str(tmp_path / "run"),
        verbose=0,
        normalize_obs=True,
        normalize_reward=True,
        target_kl=0.001,
    )
    result = algo.train()
    assert result.keys() >= RESULT_KEYS
    assert result["num_sgd_epochs"] < 20  # target_kl stopped the epochs early
    obs = np.stack([gym.make("CartPole-v1").reset(seed=i)[0] for i in range(5)])
    actions = algo.compute_actions(obs, deterministic=True)
    assert actions.shape == (5,) and set(actions.tolist()) <= {0, 1}
    assert algo.compute_actions(obs[0]) in (0, 1)
    with pytest.raises(shoal.EnvError, match=r"shape \(5, 3\)"):
        algo.compute_actions(obs[:, :3])
    algo.close()


def test_run_directory_outputs(tmp_path):
    run = tmp_path / "cp"
    with shoal.PPO(env="CartPole-v1", seed=0, run_dir=str(run), verbose=0) as algo:
        algo.learn(1024)
    assert {"config.yaml", "metrics.jsonl", "progress.csv"} <= {p.name for p in run.iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[-1]["timesteps_total"] == 1024
    assert {"timesteps_total", "perf/sps", "rollout/episode_reward_mean", "losses/policy_loss"} <= rows[0].keys()
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert header == list(rows[0].keys())  # JSONL and CSV hold the same keys
    assert "num_envs: 8" in (run / "config.yaml").read_text()


def test_cli_train_and_errors(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env: CartPole-v1\nnum_envs: 4\ntotal_timesteps: 2048\n")
    code = main(
        [
            "train",
            "--config",
            str(cfg),
            "seed=2",
            "sgd_minibatch_size=128",
            "--run-dir",
            str(tmp_path / "r"),
            "--eval-episodes",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads(out)
    assert summary["timesteps_total"] == 2048 and summary["evaluation"]["episodes"] == 3
    assert "seed: 2" in (tmp_path / "r" / "config.yaml").read_text()

    assert main(["train", "CartPole-v1", "sgd_minibach_size=64"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'sgd_minibach_size'" in err and "Did you mean 'sgd_minibatch_size'?" in err
    assert "Traceback" not in err
    assert main(["train", "CartPole-v1", "num_envs=3", "train_batch_size=256"]) == 2
    assert "not divisible by num_envs=3" in capsys.readouterr().err


def test_nan_results_before_first_episode_are_null_in_jsonl(tmp_path):
    with shoal.PPO(
        env="CartPole-v1", rollout_fragment_length=4, num_envs=2, sgd_minibatch_size=8, run_dir=str(tmp_path), verbose=0
    ) as algo:
        result = algo.train()
    assert math.isnan(result["episode_reward_mean"])
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["rollout/episode_reward_mean"] is None
