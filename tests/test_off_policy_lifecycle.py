"""The replay algorithms go through the same lifecycle as PPO: `shoal train --algo`, their statistics
in the logs, checkpoints, and `shoal eval --video` on the saved run."""

import json

import imageio
import pytest

from shoal.cli import main

RUNS = [
    ("dqn", "CartPole-v1", ["learning_starts=64", "train_freq=16", "timesteps_per_iteration=128"], "loss"),
    ("sac", "Pendulum-v1", ["learning_starts=64", "timesteps_per_iteration=128"], "entropy_coeff"),
    ("td3", "Pendulum-v1", ["learning_starts=64", "timesteps_per_iteration=128"], "actor_loss"),
    (
        "maddpg",
        "pettingzoo:mpe2.simple_spread_v3",
        ["env_config={max_cycles: 25}", "num_envs=2", "learning_starts=64", "timesteps_per_iteration=100"],
        "critic_loss",
    ),
]


@pytest.mark.parametrize(("algo", "env", "keys", "stat"), RUNS, ids=[r[0] for r in RUNS])
@pytest.mark.slow
def test_train_logs_checkpoints_and_films(tmp_path, capsys, algo, env, keys, stat):
    run = tmp_path / "run"
    settings = [f"run_dir={run}", "seed=1", "total_timesteps=256", "evaluation_num_episodes=1", *keys]
    assert main(["train", env, "--algo", algo, *settings]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["timesteps_total"] >= 256 and any(key.endswith(f"/{stat}") for key in lines[-1])
    assert any((run / "checkpoints").iterdir())
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1", "--video"]) == 0
    summary = json.loads(capsys.readouterr().out)
    with imageio.get_reader(summary["videos"][0]) as reader:
        assert reader.count_frames() - 1 == summary["episode_len_mean"]  # the reset frame, then one per step
