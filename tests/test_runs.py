"""The run lifecycle around the loop: evaluation and video, callbacks, custom metrics, logs, plots."""

import json

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import shoal
from shoal.cli import main
from shoal.logging.metrics import log_record
from shoal.logging.runs import Run, learning_curves, load_run

FAST = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=4, verbose=0)


class ScoredEnv(gym.Env):
    """Ends after 3 steps with info {"score": t, "is_success": bool, "note": str}."""

    def __init__(self, env_config=None):
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        info = {"score": float(self.episode), "is_success": bool(action), "note": "text"} if done else {}
        return np.zeros(2, np.float32), 1.0, done, False, info


class Recorder(shoal.Callback):
    def __init__(self):
        self.calls = {"episode": 0, "result": 0, "evaluate": 0, "checkpoint": 0}

    def on_episode_end(self, trainer, episode):
        self.calls["episode"] += 1
        assert episode.episode_length == 3 and episode.episode_reward == 3.0
        episode.custom_metrics["double_score"] = 2 * episode.info["score"]

    def on_train_result(self, trainer, result):
        self.calls["result"] += 1
        return result["training_iteration"] >= 4  # stop after the fourth iteration

    def on_evaluate_end(self, trainer, evaluation):
        self.calls["evaluate"] += 1

    def on_checkpoint(self, trainer, path):
        self.calls["checkpoint"] += 1
        assert (path / "meta.json").is_file()


def test_callbacks_custom_metrics_and_periodic_evaluation(tmp_path):
    recorder = Recorder()
    algo = shoal.PPO(
        env=ScoredEnv,
        num_envs=2,
        rollout_fragment_length=6,
        sgd_minibatch_size=12,
        seed=0,
        verbose=0,
        callbacks=[recorder],
        evaluation_interval=2,
        evaluation_num_episodes=3,
        checkpoint_interval=3,
        run_dir=str(tmp_path),
    )
    result = algo.learn(1000)
    algo.close()
    assert algo.iteration == 4 and algo.stop_reason == "callback"
    assert recorder.calls == {"episode": 16, "result": 4, "evaluate": 2, "checkpoint": 2}  # iteration 3 and the end
    custom = result["custom_metrics"]
    assert {"score_mean", "score_min", "score_max", "is_success_mean", "double_score_max"} <= custom.keys()
    assert "note_mean" not in custom  # only numbers aggregate
    assert custom["double_score_max"] == 2 * custom["score_max"]
    assert result["evaluation"]["episodes"] == 3 and result["evaluation"]["episode_len_mean"] == 3
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "evaluation/episode_reward_mean" in rows[1] and "evaluation/episode_reward_mean" not in rows[0]
    analysis = json.loads((tmp_path / "result.json").read_text())["metric_analysis"]
    assert analysis["custom_metrics/score_max"]["best"] == custom["score_max"]


def test_callback_specs_are_checked():
    with pytest.raises(shoal.ConfigError, match="cannot be imported"):
        shoal.PPO(callbacks=["no_such_module:Thing"], save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="has none of the hooks"):
        shoal.PPO(callbacks=[object()], save_outputs=False)


def test_jsonl_csv_and_tensorboard_hold_the_same_grouped_keys(tmp_path):
    with shoal.PPO(seed=0, run_dir=str(tmp_path), evaluation_interval=3, evaluation_num_episodes=2, **FAST) as algo:
        algo.learn(4 * 128)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert set(header) == keys  # the late evaluation keys widened the CSV header
    groups = {k.split("/")[0] for k in keys if "/" in k}
    assert groups == {"rollout", "losses", "perf", "learner", "evaluation"}
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == keys - {"timesteps_total"}


@pytest.mark.slow
def test_wandb_logs_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    with shoal.PPO(seed=0, run_dir=str(tmp_path), wandb_project="shoal-tests", **FAST) as algo:
        algo.learn(2 * 128)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


@pytest.mark.slow
def test_eval_cli_writes_mp4s_with_one_frame_per_step(tmp_path, capsys):
    run = tmp_path / "run"
    with shoal.PPO(seed=0, run_dir=str(run), **FAST) as algo:
        algo.learn(128)
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2", "--video"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["episodes"] == 2 and {"episode_reward_mean", "episode_reward_std", "episode_len_mean"} <= summary.keys()
    )
    lengths = []
    for path in summary["videos"]:
        with imageio.get_reader(path) as reader:
            lengths.append(reader.count_frames() - 1)  # the reset frame, then one per step
    assert sum(lengths) / 2 == summary["episode_len_mean"] and min(lengths) > 0
    # evaluation with video sees the same episodes as without it
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["episode_reward_mean"] == summary["episode_reward_mean"]


@pytest.mark.slow
def test_plot_three_seeds_and_compare(tmp_path, capsys):
    runs = []
    for seed in (1, 2, 3):
        run = tmp_path / f"s{seed}"
        with shoal.PPO(seed=seed, run_dir=str(run), evaluation_interval=4, evaluation_num_episodes=2, **FAST) as algo:
            algo.learn(10 * 128)
        runs.append(str(run))
    curves = learning_curves([load_run(r) for r in runs], "rollout/episode_reward_mean", "timesteps_total")
    assert len(curves) == 1 and curves[0].runs == 3 and curves[0].std.max() > 0
    out = tmp_path / "curve.png"
    assert main(["plot", *runs, "--out", str(out), "--x", "time"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    # a metric logged every few iterations only, missing from the first and last rows
    assert main(["plot", *runs, "--metric", "evaluation/episode_reward_mean", "--out", str(out)]) == 0
    assert main(["compare", *runs]) == 0
    table = capsys.readouterr().out
    assert all(r in table for r in runs) and "rollout/episode_reward_mean: final and best" in table
    assert main(["plot", *runs, "--metric", "episode_rewrd_mean"]) == 2
    assert "Did you mean 'rollout/episode_reward_mean'" in capsys.readouterr().err


def test_nested_results_are_flattened_to_any_depth():
    result = {
        "episode_reward_mean": 1.0,
        "evaluation": {"episode_reward_mean": 2.0, "policy_reward_mean": {"main": 3.0}},
    }
    assert log_record(result) == {
        "rollout/episode_reward_mean": 1.0,
        "evaluation/episode_reward_mean": 2.0,
        "evaluation/policy_reward_mean/main": 3.0,
    }


def test_runs_recording_different_keys_are_one_configuration_when_the_extra_keys_hold_defaults(tmp_path):
    def run(name, config, offset):
        rows = [{"timesteps_total": t, "rollout/episode_reward_mean": t / 100 + offset} for t in (100, 200, 300)]
        return Run(tmp_path / name, {"algo": "ppo", "env": "CartPole-v1", **config}, rows)

    older = run("s1", {"seed": 1, "learning_rate": 0.001}, 0.0)  # written before batch_mode existed
    newer = run("s2", {"seed": 2, "learning_rate": 0.001, "batch_mode": "truncate_episodes", "info_keys": []}, 2.0)
    curves = learning_curves([older, newer], "rollout/episode_reward_mean", "timesteps_total")
    assert [c.runs for c in curves] == [2] and curves[0].mean[0] == pytest.approx(2.0)

    other = run("s3", {"seed": 3, "learning_rate": 0.001, "batch_mode": "complete_episodes"}, 0.0)
    curves = learning_curves([older, newer, other], "rollout/episode_reward_mean", "timesteps_total")
    assert sorted((c.label, c.runs) for c in curves) == [
        ("batch_mode=complete_episodes", 1),
        ("batch_mode=truncate_episodes", 2),
    ]
