"""Checkpoints: exact resume, atomic writes under SIGKILL, rotation, and refusing unsafe files."""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import shoal
from shoal.cli import main
from shoal.train import checkpoint as ckpt

FAST = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=4, verbose=0)
REPO = Path(__file__).resolve().parents[1]


def _weights(algo) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in algo.get_policy().parameters()])


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    kw = dict(
        FAST,
        seed=7,
        normalize_obs=True,
        normalize_reward=True,
        evaluation_interval=2,
        evaluation_num_episodes=2,
        evaluation_deterministic=False,
        checkpoint_interval=0,
    )
    straight = shoal.PPO(run_dir=str(tmp_path / "straight"), **kw)
    for _ in range(7):
        last_straight = straight.train()

    first = shoal.PPO(run_dir=str(tmp_path / "split"), **kw)
    for _ in range(4):
        first.train()
    path = first.save()
    first.train()  # the original goes on; the resumed copy must not see this
    first.close()

    resumed = shoal.PPO.from_checkpoint(path)
    assert (resumed.iteration, resumed.timesteps_total) == (4, 4 * 128)
    for _ in range(3):
        last_resumed = resumed.train()
    assert torch.equal(_weights(resumed), _weights(straight))
    steps = [algo.algorithm.learners["default_policy"].optimizer for algo in (resumed, straight)]
    assert torch.equal(steps[0].exp_avg_sq, steps[1].exp_avg_sq)
    assert torch.equal(resumed.get_policy().obs_normalizer.stats.mean, straight.get_policy().obs_normalizer.stats.mean)
    for key in ("episode_reward_mean", "policy_loss", "timesteps_total", "learning_rate"):
        assert last_resumed[key] == last_straight[key], key
    # the resumed run appended to the split run's logs, dropping the iteration logged after the checkpoint
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == list(range(1, 8))
    resumed.close()
    straight.close()


def test_a_run_ending_on_a_periodic_checkpoint_writes_it_once(tmp_path):
    """The end of ``learn`` keeps the checkpoint its last iteration wrote (a replay learner's
    can be large); a ``learn`` that starts after a ``save`` and ends at once writes its own."""
    written = []

    class Count(shoal.Callback):
        def on_checkpoint(self, trainer, path):
            written.append(path.name)

    with shoal.PPO(seed=0, run_dir=str(tmp_path), checkpoint_interval=2, callbacks=[Count()], **FAST) as algo:
        algo.learn(4 * 128)
        assert written == ["checkpoint_000002", "checkpoint_000004"]
        algo.learn(1 * 128)
        assert written[2:] == ["checkpoint_000005"]  # not a periodic one: the end's own


def test_resuming_a_finished_run_keeps_its_budget(tmp_path):
    """A run whose last iteration passed its budget (300 steps, 384 taken), resumed twice with
    nothing left to do, still has the budget it was given, not the step count it stands at."""
    with shoal.PPO(seed=0, run_dir=str(tmp_path), total_timesteps=300, **FAST) as algo:
        algo.learn()
        assert algo.timesteps_total == 384
    for _ in range(2):
        with shoal.PPO.from_checkpoint(tmp_path) as resumed:
            assert resumed.config.total_timesteps == 300
            resumed.learn()
            assert resumed.timesteps_total == 384


def test_periodic_checkpoints_rotate_and_hold_the_whole_state(tmp_path):
    with shoal.PPO(seed=0, run_dir=str(tmp_path), checkpoint_interval=2, keep_checkpoints=2, **FAST) as algo:
        algo.learn(7 * 128)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_000006", "checkpoint_000007"]  # 2, 4 rotated away; 7 is the end checkpoint
    state, meta = ckpt.read_checkpoint(tmp_path / "checkpoints" / "checkpoint_000007")
    assert meta["algo"] == "ppo" and meta["training_iteration"] == 7 and meta["timesteps_total"] == 7 * 128
    assert {"algorithm", "collector", "backend", "rng", "config", "counters"} <= state.keys()
    assert {"policies", "learners"} <= state["algorithm"].keys()
    assert {"policy_map", "tracker", "first"} <= state["collector"].keys()
    assert state["config"]["seed"] == 0 and state["backend"]["exact"]
    result = json.loads((tmp_path / "result.json").read_text())
    analysis = result["metric_analysis"]
    assert {"last", "min", "max", "best"} <= analysis["rollout/episode_reward_mean"].keys()
    assert "best" not in analysis["losses/policy_loss"]  # lower or higher better is not known there
    assert result["timesteps_total"] == 7 * 128


def test_a_damaged_newest_checkpoint_is_skipped_and_named_when_loaded(tmp_path):
    with shoal.PPO(seed=0, run_dir=str(tmp_path), checkpoint_interval=1, **FAST) as algo:
        algo.learn(3 * 128)
    newest = tmp_path / "checkpoints" / "checkpoint_000003"
    data = (newest / "state.pt").read_bytes()
    (newest / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(shoal.CheckpointError, match="truncated or was modified"):
        shoal.PPO.from_checkpoint(newest)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        algo = shoal.PPO.from_checkpoint(tmp_path, save_outputs=False)
    assert algo.iteration == 2
    with pytest.raises(shoal.CheckpointError, match="no meta.json"):
        ckpt.read_checkpoint(tmp_path)
    with pytest.raises(shoal.CheckpointError, match="does not exist"):
        shoal.PPO.from_checkpoint(tmp_path / "nowhere")


class _RunsCode:
    """Unpickling this calls os.system: the classic malicious-checkpoint payload."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("container", ["torch_zip", "raw_pickle"])
def test_a_checkpoint_crafted_to_run_code_is_refused_and_runs_nothing(tmp_path, container):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil"
    path.mkdir()
    payload = {"policy": _RunsCode(marker)}
    with (path / "state.pt").open("wb") as f:
        if container == "torch_zip":
            torch.save(payload, f)
        else:
            pickle.dump(payload, f)
    # a forger can recompute the checksum, so that alone must not be what stops the attack
    meta = {"format": ckpt.FORMAT_VERSION, "sha256": ckpt._sha256(path / "state.pt"), "algo": "ppo"}
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(shoal.CheckpointError, match="refusing to load"):
        shoal.PPO.from_checkpoint(path)
    assert not marker.exists()


def _spawn(script: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_sigkill_while_a_checkpoint_is_written_then_resume(tmp_path):
    """The process kills itself half-way through writing its third checkpoint."""
    run = tmp_path / "run"
    proc = _spawn(
        f"""
        import os, signal, torch
        import shoal.train.checkpoint as ckpt
        real_save, calls = torch.save, []
        def dying_save(obj, f):
            calls.append(1)
            if len(calls) == 3:
                f.write(b"PK" + b"x" * 1000)  # a partial file, then a hard kill: no cleanup runs
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            real_save(obj, f)
        ckpt.torch.save = dying_save
        import shoal
        shoal.PPO(seed=1, run_dir={str(run)!r}, checkpoint_interval=1, total_timesteps=8 * 128,
                  **{FAST!r}).learn()
    """,
        tmp_path,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    leftovers = [p.name for p in (run / "checkpoints").iterdir()]
    assert "checkpoint_000003" not in leftovers and any(n.startswith(".tmp-") for n in leftovers)

    assert main(["train", "--resume", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == list(range(1, 9))
    assert rows[-1]["timesteps_total"] == 8 * 128
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())


def _wait_for(condition, timeout=60.0):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def _logged(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["training_iteration"] for line in lines if line.endswith("}")]


@pytest.mark.slow
def test_sigterm_checkpoints_and_stops_then_sigkill_loses_at_most_one_interval(tmp_path):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "shoal",
        "train",
        "CartPole-v1",
        "seed=2",
        "total_timesteps=100000000",
        "checkpoint_interval=5",
        "verbose=0",
        "--run-dir",
        str(run),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(_logged(run)) >= 12)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert json.loads(out)["stop_reason"] == "SIGTERM"
    stopped_at = json.loads((run / "result.json").read_text())["training_iteration"]
    assert _logged(run) == list(range(1, stopped_at + 1))
    assert ckpt.read_meta(ckpt.resolve_checkpoint(run))["training_iteration"] == stopped_at

    cmd[cmd.index("--run-dir") :] = ["--resume", str(run)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(_logged(run)) >= stopped_at + 13)
    proc.kill()
    proc.wait(timeout=30)
    saved = ckpt.read_meta(ckpt.resolve_checkpoint(run))["training_iteration"]
    # at most one checkpoint interval is lost (all of it when the kill lands between an iteration's log line
    # and its checkpoint)
    assert saved > stopped_at and _logged(run)[-1] - saved <= 5
    resumed = shoal.PPO.from_checkpoint(run, total_timesteps=(saved + 2) * 256, verbose=0)
    resumed.learn()
    resumed.close()
    assert _logged(run) == list(range(1, saved + 3))


def test_resuming_without_env_state_starts_every_episode_counter_afresh(tmp_path):
    """Multi-agent envs resume with new episodes: the rows' and the teams' running returns start
    from zero too, so no episode after the resume carries a part of one before it."""
    from test_pettingzoo import DyingAgentsEnv  # team episodes of 3 steps, team return 1 + 2*2 + 3*3 = 14

    def make():
        return DyingAgentsEnv()

    kw = dict(num_envs=2, rollout_fragment_length=4, sgd_minibatch_size=24, verbose=0)
    with shoal.PPO(env=make, run_dir=str(tmp_path), **kw) as algo:
        algo.train()
        assert algo.tracker.team_ret.any() and algo.tracker.ret.any()  # saved in the middle of episodes
        path = algo.save()
    with pytest.warns(UserWarning, match="starts new episodes"):
        resumed = shoal.PPO.from_checkpoint(path, env=make)
    tracker = resumed.tracker
    assert not (tracker.team_ret.any() or tracker.team_len.any() or tracker.ret.any() or tracker.len.any())
    result = resumed.train()
    resumed.close()
    assert result["episode_reward_mean"] == 14.0 and result["episode_len_mean"] == 3.0


def test_env_state_with_numpy_scalars_loads_without_unpickling_code(tmp_path):
    """MountainCar keeps its state in np.float64 scalars, which are floats to isinstance yet pickle
    as numpy objects that a weights_only load refuses: they are stored as plain data."""
    import numpy as np

    from shoal.envs.snapshot import decode, encode

    state = {"position": np.float64(-0.52), "steps": np.int32(7), "pair": (np.float32(1.5), 2.0)}
    torch.save(encode(state), tmp_path / "state.pt")
    restored = decode(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored == state
    assert [type(v) for v in (restored["position"], restored["steps"], restored["pair"][0])] == [
        np.float64,
        np.int32,
        np.float32,
    ]
    settings = dict(seed=1, learning_starts=0, gradient_steps=1, run_dir=str(tmp_path / "run"), verbose=0)
    with shoal.DQN(env="MountainCar-v0", **settings) as algo:  # one gradient step an iteration: no learning to test
        algo.learn(1000)  # ends with a checkpoint holding the envs' state
    with shoal.DQN.from_checkpoint(tmp_path / "run", verbose=0) as resumed:
        assert resumed.timesteps_total == algo.timesteps_total
