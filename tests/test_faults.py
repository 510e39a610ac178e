"""How a run stops when it cannot go on: writes the filesystem refuses, updates that diverge."""

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.files import AppendOnly
from shoal.train import checkpoint as ckpt

FAST = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=4, verbose=0)
REPO = Path(__file__).resolve().parents[1]


def no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_disk_save(obj, f):
    """What torch.save does on a full disk: a part of the file, then a RuntimeError raised while
    handling the OSError."""
    f.write(b"PK" + b"x" * 100)
    try:
        no_space()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 92800 vs 92700") from None


def logged_iterations(run: Path) -> list[int]:
    return [json.loads(line)["training_iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def all_finite(path: Path) -> bool:
    state, _ = ckpt.read_checkpoint(path)
    tensors = [t for t in state["algorithm"]["policies"]["default_policy"].values() if t.is_floating_point()]
    return all(bool(t.isfinite().all()) for t in tensors)


def test_a_full_disk_while_checkpointing_names_the_file_and_what_was_kept_then_resume(tmp_path, monkeypatch):
    run = tmp_path / "run"
    algo = shoal.PPO(seed=1, run_dir=str(run), checkpoint_interval=2, **FAST)
    algo.learn(4 * 128)
    monkeypatch.setattr(ckpt.torch, "save", full_disk_save)
    with pytest.raises(shoal.OutputError) as caught:
        algo.learn(4 * 128)
    algo.close()
    message = str(caught.value)
    assert f"could not write the checkpoint '{run / 'checkpoints' / 'checkpoint_000006'}'" in message
    assert "No space left on device" in message and "free there" in message
    assert f"Kept: checkpoint '{run / 'checkpoints' / 'checkpoint_000004'}' (iteration 4, 512 steps)" in message
    assert message.endswith(f"continue with: shoal train --resume {run}")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint_000002", "checkpoint_000004"]

    monkeypatch.undo()
    resumed = shoal.PPO.from_checkpoint(run, total_timesteps=8 * 128)
    resumed.learn()
    resumed.close()
    assert logged_iterations(run) == list(range(1, 9))


def test_a_refused_metrics_line_leaves_the_file_at_its_last_whole_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    log = AppendOnly(path)
    log.append('{"a": 1}\n')
    real_write, calls = os.write, []

    def half_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[: len(data) // 2])
        no_space()

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        log.append('{"b": 2, "c": 3}\n')
    monkeypatch.undo()
    log.close()
    assert calls == [17, 9] and path.read_text() == '{"a": 1}\n'

    run = tmp_path / "run"
    with shoal.PPO(seed=1, run_dir=str(run), **FAST) as algo:
        algo.learn(2 * 128)
        monkeypatch.setattr(os, "write", no_space)
        with pytest.raises(shoal.OutputError, match="could not write the metrics .*metrics.jsonl"):
            algo.learn(128)
        monkeypatch.undo()
    assert logged_iterations(run) == [1, 2]


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode == 0


@pytest.mark.slow
def test_a_run_on_a_filesystem_that_fills_up_stops_with_one_message_and_resumes_after_room_is_made(tmp_path):
    disk = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    if not _mount_tmpfs(disk, "400k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        run = disk / "run"
        cmd = [sys.executable, "-m", "shoal", "train", "CartPole-v1", "seed=1", "total_timesteps=400000"]
        cmd += ["checkpoint_interval=5", "verbose=0", "--run-dir", str(run)]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("shoal: error")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr
        assert "No space left on device" in errors[0] and "Traceback" not in proc.stderr
        assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())
        kept = ckpt.resolve_checkpoint(run)
        assert f"Kept: checkpoint '{kept}'" in errors[0]
        rows = logged_iterations(run)  # every line whole
        assert rows == list(range(1, len(rows) + 1)) and rows[-1] >= ckpt.read_meta(kept)["training_iteration"]

        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        resumed = [sys.executable, "-m", "shoal", "train", "--resume", str(run)]
        steps = ckpt.read_meta(kept)["timesteps_total"] + 4 * 2048
        proc = subprocess.run([*resumed, f"total_timesteps={steps}"], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["timesteps_total"] == steps
    finally:
        subprocess.run(["umount", "-l", str(disk)])


@pytest.mark.parametrize(
    "algo, settings",
    [
        ("ppo", dict(env="Pendulum-v1", tuned=False, kind_defaults=False)),  # the fused PPO step
        ("ppo", dict(FAST, fused_update=False)),  # the autograd step
        ("dqn", dict(env="CartPole-v1", learning_starts=64, timesteps_per_iteration=64, buffer_size=4096)),
        ("sac", dict(env="Pendulum-v1", learning_starts=64, timesteps_per_iteration=64, buffer_size=4096)),
    ],
)
def test_a_diverging_update_names_the_policy_and_iteration_and_no_checkpoint_holds_nan(tmp_path, algo, settings):
    run = tmp_path / "run"
    settings = {"verbose": 0, **settings}
    with shoal.Trainer(algo=algo, seed=1, run_dir=str(run), checkpoint_interval=1, **settings) as good:
        good.learn(2 * good.algorithm.steps_per_iteration)
        saved = good.iteration
    with shoal.Trainer.from_checkpoint(run, learning_rate=1e30) as bad:
        with pytest.raises(shoal.TrainingDiverged) as caught:
            bad.learn(10 * bad.algorithm.steps_per_iteration)
        after = list(bad.get_policy().parameters())
    message = str(caught.value)
    assert caught.value.policy == "default_policy"
    assert message.startswith(f"training diverged at iteration {saved + 1} (policy 'default_policy'): the update")
    assert "was not finite (loss " in message and "env" not in message.split("Nothing after")[0]
    assert f"checkpoint_{saved:06d}" in message and "learning_rate=1e+29" in message
    assert [ckpt.read_meta(p)["training_iteration"] for p in ckpt.list_checkpoints(run / "checkpoints")][-1] == saved
    assert all(all_finite(p) for p in ckpt.list_checkpoints(run / "checkpoints"))
    assert all(bool(p.isfinite().all()) for p in after)  # the step that would have broken them was not taken


def test_a_non_finite_action_is_the_policys_fault_and_never_reaches_the_env(tmp_path):
    with shoal.PPO(env="Pendulum-v1", seed=1, tuned=False, kind_defaults=False, save_outputs=False, verbose=0) as algo:
        with torch.no_grad():
            algo.get_policy().log_std.fill_(float("inf"))
        with pytest.raises(shoal.TrainingDiverged, match=r"iteration 1 \(policy 'default_policy'\): it chose a non-f"):
            algo.learn(2048)


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    with shoal.PPO(seed=1, run_dir=str(tmp_path / "run"), **FAST) as algo:
        algo.learn(128)
        with torch.no_grad():
            next(algo.get_policy().parameters())[0].fill_(float("nan"))
        with pytest.raises(shoal.TrainingDiverged, match=r"at iteration 1 \(policy 'default_policy'\): its weights"):
            algo.save(tmp_path / "by_hand")
        with pytest.raises(shoal.TrainingDiverged, match="its weights hold non-finite values"):
            algo.save()
    assert [p.name for p in checkpoints.iterdir()] == ["checkpoint_000001"] and not (tmp_path / "by_hand").exists()


def _training_with_slow_checkpoints(
    run: Path, marker: Path, slow: tuple[int, ...], torch_error: bool = False, slow_pruning: bool = False
) -> subprocess.Popen:
    """`shoal train` whose checkpoint writes number ``slow`` (1: the first) take 8 s after writing
    part of the file, and say (``marker``) when one is under way. ``torch_error``: an interrupt
    during that write surfaces as torch's zip writer reports it, a RuntimeError. ``slow_pruning``:
    the pruning after those writes takes the 8 s instead (an interrupt lands between the two)."""
    script = f"""
        import sys, time, pathlib, torch
        import shoal.train.checkpoint as ckpt
        import shoal.train.lineage as lineage
        from shoal.cli import main
        real_save, real_rotate, calls, paused = torch.save, lineage.rotate, [], []
        def pause():
            pathlib.Path({str(marker)!r}).write_text("writing")
            time.sleep(8)
            pathlib.Path({str(marker)!r}).unlink()
        def slow_save(obj, f):
            calls.append(1)
            if len(calls) not in {slow!r} or {slow_pruning!r}:
                return real_save(obj, f)
            f.write(b"PK" + b"x" * 1000)
            f.flush()
            try:
                pause()
            except KeyboardInterrupt:
                if {torch_error!r}:
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1002 vs 900")
                raise
            f.seek(0)
            f.truncate()
            real_save(obj, f)
        def slow_rotate(*args):
            if {slow_pruning!r} and len(calls) in {slow!r} and not paused:
                paused.append(1)
                pause()
            real_rotate(*args)
        ckpt.torch.save = slow_save
        lineage.rotate = slow_rotate
        sys.exit(main(["train", "CartPole-v1", "seed=1", "total_timesteps=100000000", "checkpoint_interval=5",
                       "keep_checkpoints=2", "verbose=0", "--run-dir", {str(run)!r}]))
    """
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-c", textwrap.dedent(script)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, timeout=120.0):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


def _iterations_logged(run: Path) -> int:
    """Iterations the run has logged: a stop asked for after the newest is its own checkpoint's
    (the end of a run keeps a periodic checkpoint of its last iteration rather than writing it again)."""
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def _interrupted_twice(proc: subprocess.Popen, marker: Path) -> str:
    """Ctrl-C (the run stops after this iteration: the last checkpoint starts), then Ctrl-C again
    once that write is under way; the run must end at once (not after the 8 s write), with exit
    130 and one message. Returns that message."""
    proc.send_signal(signal.SIGINT)
    _wait_for(marker.exists)
    proc.send_signal(signal.SIGINT)
    started = time.time()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.time() - started < 6.5, err
    assert "Traceback" not in err, err
    (message,) = [line for line in err.splitlines() if line.startswith("shoal:") and "writing to" not in line]
    return message


@pytest.mark.slow
@pytest.mark.parametrize("torch_error", [False, True], ids=["interrupt", "torch-writer-error"])
def test_a_second_ctrl_c_during_the_last_checkpoint_exits_at_once_and_names_what_was_kept(tmp_path, torch_error):
    run, marker = tmp_path / "run", tmp_path / "writing"
    proc = _training_with_slow_checkpoints(run, marker, slow=(2,), torch_error=torch_error)
    _wait_for(lambda: (run / "checkpoints" / "checkpoint_000005").is_dir() and not marker.exists())
    _wait_for(lambda: _iterations_logged(run) > 5)  # stopped after iteration 5 the run would keep its checkpoint
    message = _interrupted_twice(proc, marker)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["checkpoint_000005"]
    assert ckpt.resolve_checkpoint(run).name == "checkpoint_000005"
    assert message.startswith("shoal: interrupted at iteration ")
    assert f"Kept: checkpoint '{run / 'checkpoints' / 'checkpoint_000005'}' (iteration 5, " in message
    assert message.endswith(f"Continue with: shoal train --resume {run}")


@pytest.mark.slow
def test_a_second_ctrl_c_between_a_checkpoint_and_its_pruning_keeps_keep_checkpoints(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "writing"
    proc = _training_with_slow_checkpoints(run, marker, slow=(3,), slow_pruning=True)  # keep_checkpoints=2
    _wait_for(lambda: (run / "checkpoints" / "checkpoint_000010").is_dir() and not marker.exists())
    _wait_for(lambda: _iterations_logged(run) > 10)
    message = _interrupted_twice(proc, marker)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(names) == 2 and names[0] == "checkpoint_000010", names
    assert f"Kept: checkpoint '{run / 'checkpoints' / names[-1]}'" in message


@pytest.mark.slow
def test_sigterm_during_a_checkpoint_write_lets_it_finish_then_stops(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "writing"
    proc = _training_with_slow_checkpoints(run, marker, slow=(1,))
    _wait_for(marker.exists)  # the periodic checkpoint of iteration 5
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    stopped = json.loads((run / "result.json").read_text())["training_iteration"]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[0] == "checkpoint_000005" and names[-1] == f"checkpoint_{stopped:06d}" and stopped in (5, 6)
    assert all(ckpt.verify(run / "checkpoints" / name) for name in names)


@pytest.mark.slow
def test_a_video_cut_short_by_a_full_disk_is_removed_and_named(tmp_path, monkeypatch):
    import imageio_ffmpeg

    real_count = imageio_ffmpeg.count_frames_and_secs
    monkeypatch.setattr(imageio_ffmpeg, "count_frames_and_secs", lambda path: (real_count(path)[0] // 2, 0.0))
    cut_short = r"could not write the evaluation video .*ffmpeg wrote \d+ of its"
    with shoal.PPO(seed=1, save_outputs=False, **FAST) as algo, pytest.raises(shoal.OutputError, match=cut_short):
        algo.evaluate(num_episodes=1, video_dir=tmp_path / "videos")
    assert list((tmp_path / "videos").iterdir()) == []


@pytest.mark.slow
def test_a_half_minute_soak_grows_no_descriptors_and_no_child_processes():
    """Long enough for some hundred checkpoints and evaluations, which is what would leak."""
    from benchmarks.soak import soak, table

    sampler = soak(minutes=0.5, every=3.0)
    assert len(sampler.samples) >= 6 and sampler.iterations >= 200
    rows = {name: (first, last) for name, first, last, _ in table(sampler)}
    assert rows["open file descriptors"][0] == rows["open file descriptors"][1]
    assert rows["child processes"][0] == rows["child processes"][1]  # the workers, and what other tests left
    assert all(len(s.worker_rss_mb) == 2 for s in sampler.samples)


class KillWorker(shoal.Callback):
    """SIGKILLs env worker 0 (as the OOM killer would) after iteration ``at``."""

    def __init__(self, at: int):
        self.at = at

    def on_train_result(self, trainer, result):
        if result["training_iteration"] == self.at:
            os.kill(trainer.backend.pids[0], signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_after_checkpointing_the_learner_and_resume_goes_on(tmp_path):
    run = tmp_path / "run"
    settings = dict(FAST, num_workers=2, checkpoint_interval=1000)
    with (
        shoal.PPO(seed=1, run_dir=str(run), callbacks=[KillWorker(at=12)], **settings) as algo,
        pytest.raises(shoal.EnvError, match=r"env worker 0 .* died with exit code -9") as caught,
    ):
        algo.learn(40 * 128)
    assert str(caught.value).endswith(
        f"\nThe learner's state at iteration 12 was checkpointed first; continue with: shoal train --resume {run}"
    )
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000012"]
    died = r"the episodes under way were not saved \(the run stopped on: env worker 0 .* died with exit code -9"
    with pytest.warns(shoal.ShoalWarning, match=died) as warned:
        resumed = shoal.PPO.from_checkpoint(run, total_timesteps=16 * 128)
    assert [Path(w.filename) for w in warned] == [Path(__file__)]  # the line that resumed, not shoal's or torch's
    with resumed:
        assert resumed.iteration == 12
        resumed.learn()
    assert logged_iterations(run) == list(range(1, 17))


class FlakyCartPole(gym.Wrapper):
    """CartPole-v1 whose step raises on ``rate`` of the calls, as a crashing simulator would; with
    ``at``, only on calls that would be an episode's ``at``-th step."""

    def __init__(self, env_config=None):
        super().__init__(gym.make("CartPole-v1"))
        self.rate, self.at = (env_config or {}).get("rate", 0.01), (env_config or {}).get("at")
        self.rng, self.steps = np.random.default_rng(), 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.steps = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.at in (None, self.steps) and self.rng.random() < self.rate:
            raise RuntimeError("the simulator crashed")
        return self.env.step(action)


shoal.register_env("FlakyCartPole-v0", FlakyCartPole)


@pytest.mark.parametrize("workers", [0, 2])
def test_failed_envs_are_made_anew_counted_and_left_out_of_the_metrics(workers, recwarn):
    settings = dict(env="FlakyCartPole-v0", num_workers=workers, restart_failed_envs=True, max_restarts_per_hour=1000)
    settings["env_config"] = {"rate": 0.3, "at": 3}  # 3 in 10 episodes fail at their third step
    with shoal.PPO(seed=1, save_outputs=False, **{**FAST, **settings}) as algo:
        result = algo.learn(20 * 128)
        episodes = list(algo.tracker.returns)
    assert 10 < result["num_env_restarts"] < 80
    warned = [w for w in recwarn if "failed (RuntimeError: the simulator crashed) and was made anew" in str(w)]
    assert len(warned) == 4  # once for each env
    assert len(episodes) > 20 and min(episodes) >= 8  # no episode cut at its third step (CartPole's shortest: 8)

    with pytest.raises(shoal.EnvError, match="raised RuntimeError in step"):
        shoal.PPO(seed=1, save_outputs=False, **{**FAST, "env": "FlakyCartPole-v0"}).learn(20 * 128)


def test_a_restarted_step_bootstraps_the_step_before_it_and_is_not_learned():
    from shoal.algos.returns import gae

    # decisions at 0 and 1, a restart at 2 (no transition, truncated, final value V(obs_2) = 5), a new episode at 3
    reward = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    value = torch.tensor([[2.0, 3.0, 5.0, 7.0, 11.0]])
    done = torch.zeros(1, 4, dtype=torch.bool)
    truncated = torch.tensor([[False, False, True, False]])
    final_value = torch.tensor([[0.0, 0.0, 5.0, 0.0]])
    valid = torch.tensor([[True, True, False, True]])
    adv = gae(reward, value, done, truncated, final_value, gamma=0.9, gae_lambda=1.0, valid_t=valid)
    delta_1 = 1.0 + 0.9 * 5.0 - 3.0  # the step before the failure bootstraps from the observation it reached
    assert adv[0, 1].item() == pytest.approx(delta_1)
    assert adv[0, 2].item() == 0.0  # the failed step is not a decision
    assert adv[0, 3].item() == pytest.approx(1.0 + 0.9 * 11.0 - 7.0)  # the new episode starts clean


def test_envs_that_keep_failing_stop_the_run_at_the_restart_budget():
    settings = dict(env="FlakyCartPole-v0", env_config={"rate": 0.2}, restart_failed_envs=True, max_restarts_per_hour=5)
    with (
        shoal.PPO(seed=1, save_outputs=False, **{**FAST, **settings}) as algo,
        pytest.raises(shoal.EnvError, match=r"failed within the last hour, more than max_restarts_per_hour=5"),
    ):
        algo.learn(10 * 128)


@pytest.mark.slow
def test_a_killed_worker_is_started_anew_and_the_run_reaches_its_budget(tmp_path, recwarn):
    settings = dict(FAST, num_workers=2, recreate_failed_workers=True)
    with shoal.PPO(seed=1, run_dir=str(tmp_path / "run"), callbacks=[KillWorker(at=5)], **settings) as algo:
        result = algo.learn(12 * 128)
        assert algo.backend.pids[0] != algo.backend.pids[1]
    assert result["timesteps_total"] == 12 * 128 and result["num_worker_restarts"] == 1
    assert any("env worker 0 " in str(w.message) and "started anew" in str(w.message) for w in recwarn)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == list(range(1, 13))
    assert [r["workers/num_worker_restarts"] for r in rows] == [0] * 5 + [1] * 7


@pytest.mark.slow
def test_a_recreated_workers_step_is_a_truncation_that_is_not_a_transition():
    from shoal.vector import make_backend

    backend = make_backend("CartPole-v1", 4, num_workers=2, recreate_failed_workers=True)
    try:
        backend.reset(1)
        backend.recv()
        os.kill(backend.pids[0], signal.SIGKILL)
        time.sleep(0.2)
        backend.send(torch.zeros(4, dtype=torch.long))
        batch = backend.recv()
        assert batch.valid.tolist() == [False, False, True, True] and batch.truncated[:2].all()
        assert batch.reward[:2].tolist() == [0.0, 0.0] and backend.failed_rows == [0, 1]
        assert len(backend.worker_restarts) == 1 and "died with exit code -9" in backend.worker_restarts[0]
        backend.send(torch.zeros(4, dtype=torch.long))
        assert backend.recv().valid.all()  # its envs step again
    finally:
        backend.close()


class NanObsPendulum(gym.Wrapper):
    """Pendulum-v1 whose 5th step returns a NaN observation."""

    def __init__(self, env_config=None):
        super().__init__(gym.make("Pendulum-v1"))
        self.steps = 0

    def step(self, action):
        obs, *rest = self.env.step(action)
        self.steps += 1
        return (obs * np.nan if self.steps == 5 else obs), *rest


shoal.register_env("NanObsPendulum-v0", NanObsPendulum)


@pytest.mark.parametrize("env", ["NanObsPendulum-v0"])
def test_a_non_finite_observation_is_the_envs_fault_not_a_diverged_policy(env):
    with (
        shoal.PPO(env=env, seed=1, save_outputs=False, verbose=0) as algo,
        pytest.raises(shoal.EnvError, match=r"env 'NanObsPendulum-v0' \(env 0\) returned a non-finite observation"),
    ):
        algo.learn(2048)


def test_the_restart_budget_stops_a_crash_loop_while_the_rollout_is_collected():
    settings = dict(env="FlakyCartPole-v0", env_config={"rate": 1.0}, restart_failed_envs=True, max_restarts_per_hour=5)
    with (
        shoal.DQN(seed=1, save_outputs=False, verbose=0, **settings) as algo,
        pytest.raises(shoal.EnvError, match="more than max_restarts_per_hour=5"),
    ):
        algo.learn(2000)


def test_a_restarted_env_ends_its_episode_at_the_observation_it_failed_from_and_the_tracker_drops_it():
    from shoal.collect import EpisodeTracker
    from shoal.vector import make_backend

    backend = make_backend("FlakyCartPole-v0", 2, env_config={"rate": 0.0}, restart_failed_envs=True)
    backend.reset(3)
    backend.recv()
    before = backend.batch.obs.clone()
    backend.envs[1].rate = 1.0  # env 1 fails on its next step
    backend.send(torch.zeros(2, dtype=torch.long))
    batch = backend.recv()
    assert batch.valid.tolist() == [True, False] and batch.truncated.tolist() == [False, True]
    assert torch.equal(batch.final_obs[1], before[1]) and not torch.equal(batch.obs[1], before[1])
    assert backend.restarted == [(1, "RuntimeError: the simulator crashed")]
    backend.close()

    tracker = EpisodeTracker(2, 10, drop_failed=True)
    valid = np.array([[True, True], [True, False], [True, True]])
    done = np.array([[False, False], [False, True], [True, True]])
    tracker.add(np.ones((3, 2)), done, valid)
    assert list(tracker.returns) == [3.0, 1.0] and tracker.episodes_total == 2  # env 1's first episode is left out


def test_the_metrics_writers_failing_on_close_give_one_output_error(tmp_path, monkeypatch):
    from shoal.logging.writers import TensorBoardWriter

    def deferred_refusal(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(TensorBoardWriter, "close", deferred_refusal)
    algo = shoal.PPO(seed=1, run_dir=str(tmp_path / "run"), **FAST)
    algo.learn(128)
    with pytest.raises(shoal.OutputError, match=r"could not write the metrics '.*run': No space left"):
        algo.close()
    with pytest.raises(KeyError), shoal.PPO(seed=1, run_dir=str(tmp_path / "run2"), **FAST) as other:
        other.learn(128)
        raise KeyError("the error under way stays the one raised")


@pytest.mark.parametrize(
    "config, settings, message",
    [
        ("PPOConfig", dict(backend="external"), r"restart_failed_envs .*backend='external' the simulators"),
        ("PPOConfig", dict(backend="ray", num_workers=1, remote_worker_envs=True), r"remote_worker_envs make their"),
        ("PPOConfig", dict(env="CartPole-v1", vectorization_mode="sync"), r"envs that shoal makes one by one"),
        ("GRPOConfig", dict(), r"restart_failed_envs is not for this algorithm yet: .*group"),
        ("DQNConfig", dict(n_step=3), r"restart_failed_envs is not for this algorithm yet: n-step returns"),
        (
            "DQNConfig",
            dict(restart_failed_envs=False, recreate_failed_workers=True, backend="ray", num_workers=1, n_step=3),
            r"recreate_failed_workers is not .*: n-step returns",
        ),
        ("PPOConfig", dict(restart_failed_envs=False, recreate_failed_workers=True), r"needs num_workers > 0"),
        (
            "GRPOConfig",
            dict(restart_failed_envs=False, recreate_failed_workers=True, num_workers=1),
            r"yet: .*group.*backend='ray'",
        ),
    ],
)
def test_restarts_where_they_cannot_work_are_refused_with_the_reason(config, settings, message):
    from shoal import config as configs

    with pytest.raises(shoal.ConfigError, match=message):
        getattr(configs, config).build(**{"restart_failed_envs": True, **settings})


def test_a_ray_workers_replacement_samples_its_fragment_again_so_it_suits_grpo():
    from shoal.config import GRPOConfig

    assert GRPOConfig.build(backend="ray", num_workers=1, recreate_failed_workers=True).recreate_failed_workers


def test_a_policy_with_its_own_step_size_is_told_to_lower_that_one(tmp_path):
    from shoal.config import parse_overrides

    run = tmp_path / "run"
    own = {"default_policy": {"learning_rate": 3e-4, "gamma": 0.9}}
    with shoal.PPO(seed=1, run_dir=str(run), policies=own, checkpoint_interval=1, **FAST) as good:
        good.learn(128)
    own["default_policy"]["learning_rate"] = 1e30
    with shoal.PPO.from_checkpoint(run, policies=own) as bad, pytest.raises(shoal.TrainingDiverged) as caught:
        bad.learn(5 * 128)
    command = str(caught.value).split("continue with: ")[1].split(" (max_grad_norm")[0]
    assert command == f"shoal train --resume {run} policies.default_policy.learning_rate=1e+29"
    with shoal.PPO.from_checkpoint(run, **parse_overrides(shlex.split(command)[4:])) as lowered:
        assert lowered.algorithm.policy_configs["default_policy"].learning_rate == 1e29
        assert lowered.algorithm.policy_configs["default_policy"].gamma == 0.9


def test_a_refused_plot_is_one_output_error_and_leaves_no_broken_image(tmp_path, monkeypatch):
    from shoal.logging.runs import plot_runs

    with shoal.PPO(seed=1, run_dir=str(tmp_path / "run"), **FAST) as algo:
        algo.learn(2 * 128)

    def refused(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("shoal.files.os.fsync", refused)
    out = tmp_path / "plots" / "curve.png"
    with pytest.raises(shoal.OutputError, match=r"could not write the plot '.*curve.png': No space left on device \("):
        plot_runs([str(tmp_path / "run")], "episode_reward_mean", "timesteps", out)
    assert list(out.parent.iterdir()) == []  # neither the image nor its temporary file
    monkeypatch.undo()
    assert plot_runs([str(tmp_path / "run")], "episode_reward_mean", "timesteps", out).stat().st_size > 1000


def test_a_dotted_policy_id_is_told_to_lower_its_step_size_in_a_pair_that_keeps_the_id_whole(monkeypatch):
    from types import SimpleNamespace

    from shoal.config import parse_overrides
    from shoal.train import faults

    monkeypatch.setattr(faults, "what_was_kept", lambda run_dir, then, overrides="": f"resume{overrides}")
    own = {"team.red": {"learning_rate": 1.0, "gamma": 0.9}}
    trainer = SimpleNamespace(
        config=SimpleNamespace(policies=own, learning_rate=3e-4),
        algorithm=SimpleNamespace(policy_configs={"team.red": SimpleNamespace(learning_rate=1.0)}),
        run_dir=None,
    )
    message = str(faults.diverged(shoal.TrainingDiverged("loss nan.", "team.red"), trainer, 3))
    pair = message.split("resume ")[1].split(" (max_grad_norm")[0]
    assert parse_overrides(shlex.split(pair)) == {"policies": {"team.red": {"learning_rate": 0.1, "gamma": 0.9}}}
