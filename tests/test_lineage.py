"""A checkpoint belongs to its run: loads compare its algorithm, config fingerprint and run id with
the run's, pruning touches only the run's own, a resume goes on to the run's budget; a run
directory that cannot hold a run is refused before anything trains."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import shoal
from shoal.errors import ShoalWarning
from shoal.train import checkpoint as ckpt
from shoal.train import lineage

FAST = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, num_sgd_iter=2, verbose=0)
ITERATION = 4 * 32
REPO = Path(__file__).resolve().parents[1]


def shoal_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "shoal", *args], env=env, cwd=cwd, capture_output=True, text=True)


def one_error(proc: subprocess.CompletedProcess) -> str:
    """The one `shoal: error` line a refused command prints, with exit 2 and no traceback."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("shoal: error")]
    return line


@pytest.fixture
def ppo_run(tmp_path):
    """A PPO run of 3 iterations with a checkpoint at each."""
    run = tmp_path / "ppo_run"
    with shoal.PPO(seed=1, run_dir=str(run), checkpoint_interval=1, keep_checkpoints=5, **FAST) as algo:
        algo.learn(3 * ITERATION)
    return run


def test_a_run_records_its_identity_and_each_checkpoint_carries_it(ppo_run):
    identity = json.loads((ppo_run / lineage.RUN_FILE).read_text())
    metas = [ckpt.read_meta(p) for p in ckpt.list_checkpoints(ppo_run / "checkpoints")]
    assert len(metas) == 3 and identity["algo"] == "ppo" and identity["env"] == "CartPole-v1"
    assert {m["run_id"] for m in metas} == {identity["run_id"]}
    assert {m["fingerprint"] for m in metas} == {identity["fingerprint"]}
    with shoal.PPO.from_checkpoint(ppo_run, total_timesteps=4 * ITERATION) as resumed:
        resumed.learn()
    assert ckpt.read_meta(ckpt.resolve_checkpoint(ppo_run))["run_id"] == identity["run_id"]  # kept across resumes
    assert json.loads((ppo_run / lineage.RUN_FILE).read_text()) == identity


@pytest.mark.parametrize("algo", ["dqn", "nosuch"])
@pytest.mark.slow
def test_a_meta_json_naming_another_algorithm_is_refused_by_eval_and_resume(ppo_run, algo):
    newest = ckpt.resolve_checkpoint(ppo_run)
    meta = json.loads((newest / ckpt.META_FILE).read_text())
    (newest / ckpt.META_FILE).write_text(json.dumps({**meta, "algo": algo}))
    expected = f"contradicts itself: its meta.json says algo '{algo}'"
    with pytest.raises(ckpt.CheckpointError, match=expected):
        shoal.Trainer.from_checkpoint(ppo_run)
    for command in (["eval", str(ppo_run), "--episodes", "1"], ["train", "--resume", str(ppo_run)]):
        line = one_error(shoal_cli(*command))
        assert expected in line and "written by algo 'ppo'" in line


@pytest.mark.slow
def test_another_runs_checkpoint_copied_in_is_refused_and_the_run_loses_nothing(ppo_run, tmp_path):
    other = tmp_path / "dqn_run"
    with shoal.DQN(env="CartPole-v1", seed=1, run_dir=str(other), learning_starts=64, verbose=0) as dqn:
        dqn.learn(256)
    foreign = ppo_run / "checkpoints" / "checkpoint_000999"
    shutil.copytree(ckpt.resolve_checkpoint(other), foreign)
    before = {name: (ppo_run / name).read_text() for name in ("config.yaml", "metrics.jsonl")}
    ppo_id = json.loads((ppo_run / lineage.RUN_FILE).read_text())["run_id"]
    dqn_id = json.loads((other / lineage.RUN_FILE).read_text())["run_id"]
    for command in (["eval", str(ppo_run), "--episodes", "1"], ["train", "--resume", str(ppo_run)]):
        line = one_error(shoal_cli(*command))
        assert f"checkpoint '{foreign}' is not a checkpoint of the run in '{ppo_run}'" in line
        assert f"run {dqn_id} (dqn on CartPole-v1)" in line and f"run {ppo_id} (ppo on CartPole-v1)" in line
        assert "they differ in run id, algorithm, config fingerprint" in line
    assert before == {name: (ppo_run / name).read_text() for name in before}
    with pytest.raises(ckpt.CheckpointError, match="is not a checkpoint of the run"):
        shoal.PPO.from_checkpoint(foreign)  # named directly, it is still checked against the run it sits in

    # moved out of the run, it loads again; resuming from the run's own newest goes on, and
    # pruning keeps to this run's checkpoints
    shutil.rmtree(foreign)
    with shoal.PPO.from_checkpoint(ppo_run, total_timesteps=8 * ITERATION, keep_checkpoints=2) as resumed:
        (ppo_run / "checkpoints" / "checkpoint_000999").mkdir()  # a stranger's directory, not a checkpoint
        shutil.copytree(ckpt.resolve_checkpoint(other), ppo_run / "checkpoints" / "checkpoint_000998")
        resumed.learn()
    names = sorted(p.name for p in (ppo_run / "checkpoints").iterdir())
    assert names == ["checkpoint_000007", "checkpoint_000008", "checkpoint_000998", "checkpoint_000999"]


def test_resuming_from_an_older_checkpoint_sets_the_newer_ones_aside_instead_of_pruning_them(ppo_run):
    first = ppo_run / "checkpoints" / "checkpoint_000001"
    with (
        pytest.warns(ShoalWarning, match=r"resumed from iteration 1, before them; 2 checkpoints, checkpoint_000002 to"),
        shoal.PPO.from_checkpoint(first, run_dir=str(ppo_run), total_timesteps=6 * ITERATION, keep_checkpoints=2) as r,
    ):
        r.learn()
    (aside,) = [p for p in (ppo_run / "checkpoints").iterdir() if p.name.startswith("superseded-")]
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint_000002", "checkpoint_000003"]
    assert all(ckpt.verify(p) for p in aside.iterdir())  # whole, not overwritten by the new iterations 2 and 3
    kept = [p.name for p in ckpt.list_checkpoints(ppo_run / "checkpoints")]
    assert kept == ["checkpoint_000005", "checkpoint_000006"]


def test_a_resume_that_changes_the_model_is_refused_before_any_env_starts(ppo_run):
    with pytest.raises(ckpt.CheckpointError) as caught:
        shoal.PPO.from_checkpoint(ppo_run, model_config={"hiddens": [8]})
    message = str(caught.value)
    assert "change what checkpoint" in message and "model_config: {" in message and "-> {'hiddens': [8]" in message


@pytest.mark.slow
def test_an_unfinished_budget_is_the_one_a_resume_goes_on_to(tmp_path):
    """`learn(n)` is the run's budget: a resume without total_timesteps (as every printed resume
    command is) trains on to n, not to the config's default total."""

    class StopAt(shoal.Callback):
        def on_train_result(self, trainer, result):
            return result["training_iteration"] == 2

    run = tmp_path / "run"
    with shoal.PPO(seed=1, run_dir=str(run), callbacks=[StopAt()], **FAST) as algo:
        algo.learn(5 * ITERATION)
    assert json.loads((run / "result.json").read_text())["stop_reason"] == "callback"
    proc = shoal_cli("train", "--resume", str(run), "learning_rate=1e-4")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["timesteps_total"] == 5 * ITERATION
    assert json.loads((run / "result.json").read_text())["stop_reason"] == "total_timesteps"

    proc = shoal_cli("train", "--resume", str(run))  # at its budget: nothing to train, and it says so
    assert proc.returncode == 0 and json.loads(proc.stdout)["timesteps_total"] == 5 * ITERATION
    assert f"its budget (total_timesteps={5 * ITERATION}); give a larger total_timesteps" in proc.stderr


def test_a_resumed_run_still_names_its_tuned_config(tmp_path):
    run = tmp_path / "run"
    with shoal.PPO(env="CartPole-v1", seed=1, run_dir=str(run), verbose=0) as algo:
        tuned = algo.tuned_config
        algo.learn(1)
    assert tuned is not None
    with shoal.PPO.from_checkpoint(run, total_timesteps=algo.timesteps_total + 1) as resumed:
        assert resumed.tuned_config == tuned
        resumed.learn()
    assert json.loads((run / "result.json").read_text())["tuned_config"] == str(tuned)


def test_a_run_that_fails_in_its_first_iteration_leaves_its_run_directory(tmp_path):
    run = tmp_path / "run"
    with (
        pytest.raises(shoal.TrainingDiverged, match="No checkpoint of this run was written yet"),
        shoal.PPO(seed=1, run_dir=str(run), learning_rate=1e30, **FAST) as algo,
    ):
        algo.learn(4 * ITERATION)
    assert (run / "config.yaml").is_file() and (run / lineage.RUN_FILE).is_file()


@pytest.mark.parametrize("layout", ["a file", "under a file", "checkpoints a file"])
@pytest.mark.slow
def test_a_run_directory_that_cannot_hold_a_run_is_refused_before_training(tmp_path, monkeypatch, layout):
    (tmp_path / "afile").write_text("not a directory")
    run = {"a file": "afile", "under a file": "afile/sub", "checkpoints a file": "run"}[layout]
    if layout == "checkpoints a file":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "checkpoints").write_text("not a directory")
    expected = {
        "a file": "run_dir 'afile' is a file; give a directory",
        "under a file": "run_dir 'afile/sub' is under 'afile', which is a file",
        "checkpoints a file": "run_dir 'run' holds a file named 'checkpoints'",
    }[layout]
    line = one_error(shoal_cli("train", "CartPole-v1", "total_timesteps=100000", "--run-dir", run, cwd=tmp_path))
    assert expected in line
    assert not list(tmp_path.rglob("*.yaml")) and not list(tmp_path.rglob("metrics.jsonl"))  # nothing ran
    monkeypatch.chdir(tmp_path)
    with pytest.raises(shoal.ConfigError, match=expected):
        shoal.PPO(seed=1, run_dir=run, **FAST)


def test_shoals_warnings_point_at_the_users_line(ppo_run):
    newest = ckpt.resolve_checkpoint(ppo_run)
    (newest / ckpt.STATE_FILE).write_bytes(b"damaged")
    with pytest.warns(ShoalWarning, match="skipping damaged checkpoint") as caught:
        shoal.PPO.from_checkpoint(ppo_run).close()
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}


def test_a_new_run_in_an_old_runs_directory_sets_the_old_checkpoints_aside_and_resumes(ppo_run):
    old_id = json.loads((ppo_run / lineage.RUN_FILE).read_text())["run_id"]
    with (
        pytest.warns(ShoalWarning, match="a new run started in this directory; 3 checkpoints"),
        shoal.PPO(seed=2, run_dir=str(ppo_run), checkpoint_interval=1, **FAST) as again,
    ):
        again.learn(2 * ITERATION)
    assert json.loads((ppo_run / lineage.RUN_FILE).read_text())["run_id"] == again.run_id != old_id
    (aside,) = [p for p in (ppo_run / "checkpoints").iterdir() if p.name.startswith("earlier-run-")]
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    with shoal.PPO.from_checkpoint(ppo_run, total_timesteps=3 * ITERATION) as resumed:
        assert resumed.iteration == 2 and resumed.run_id == again.run_id
        resumed.learn()


def test_a_run_written_before_run_ids_resumes_and_is_claimed(ppo_run):
    """A run directory without run.json, whose checkpoints record no run id or fingerprint."""
    (ppo_run / lineage.RUN_FILE).unlink()
    for path in ckpt.list_checkpoints(ppo_run / "checkpoints"):
        meta = json.loads((path / ckpt.META_FILE).read_text())
        (path / ckpt.META_FILE).write_text(
            json.dumps({k: v for k, v in meta.items() if k not in ("run_id", "fingerprint")})
        )
    with shoal.PPO.from_checkpoint(ppo_run, total_timesteps=5 * ITERATION, keep_checkpoints=2) as resumed:
        resumed.learn()
    kept = ckpt.list_checkpoints(ppo_run / "checkpoints")  # the old checkpoints were the run's own, and pruned
    assert [p.name for p in kept] == ["checkpoint_000004", "checkpoint_000005"]
    assert json.loads((ppo_run / lineage.RUN_FILE).read_text())["run_id"] == resumed.run_id


def make_cartpole(env_config=None):
    import gymnasium as gym

    return gym.make("CartPole-v1")


def test_the_fingerprint_is_the_same_for_a_class_and_its_import_path_and_across_processes():
    """A user's model class is stored as 'module:Class' and passed again as the class; an env object
    is stored by its repr, whose memory address changes in every process."""
    stored = {"algo": "ppo", "env": "<function make_cartpole at 0x7f0000000001>", "model": "mod:Net"}
    again = {"algo": "ppo", "env": "<function make_cartpole at 0x7f00000000ff>", "model": type("Net", (), {})}
    again["model"].__module__ = "mod"
    assert lineage.fingerprint(stored) == lineage.fingerprint(again)
    assert lineage.fingerprint(stored) != lineage.fingerprint({**stored, "model_config": {"hiddens": [8]}})


@pytest.mark.slow
def test_runs_on_an_env_object_resume_again_and_again(tmp_path):
    """The env is stored by its repr, whose memory address changes in every process."""
    run = tmp_path / "run"
    settings = {k: v for k, v in FAST.items() if k != "env"}
    with shoal.PPO(env=make_cartpole, seed=1, run_dir=str(run), **settings) as algo:
        algo.learn(ITERATION)
    for steps in (2, 3):
        script = f"""
import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
import shoal, test_lineage
with shoal.PPO.from_checkpoint({str(run)!r}, env=test_lineage.make_cartpole, total_timesteps={steps * ITERATION}) as r:
    r.learn()
"""
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert ckpt.read_meta(ckpt.resolve_checkpoint(run))["timesteps_total"] == 3 * ITERATION


def test_another_runs_checkpoint_where_this_run_writes_is_set_aside_not_replaced(ppo_run, tmp_path):
    other = tmp_path / "other"
    with shoal.PPO(seed=3, run_dir=str(other), **FAST) as algo:
        algo.learn(4 * ITERATION)  # its final checkpoint: checkpoint_000004
    with shoal.PPO.from_checkpoint(ppo_run, total_timesteps=4 * ITERATION) as resumed:
        shutil.copytree(other / "checkpoints" / "checkpoint_000004", ppo_run / "checkpoints" / "checkpoint_000004")
        with pytest.warns(ShoalWarning, match=r"run \w+ wrote it, and run \w+ writes there now; checkpoint_000004"):
            resumed.learn()
    (aside,) = [p for p in (ppo_run / "checkpoints").iterdir() if p.name.startswith("other-run-")]
    assert (
        ckpt.read_meta(aside / "checkpoint_000004")["run_id"]
        == json.loads((other / lineage.RUN_FILE).read_text())["run_id"]
    )
    assert ckpt.read_meta(ppo_run / "checkpoints" / "checkpoint_000004")["run_id"] == resumed.run_id


@pytest.mark.slow
def test_resume_from_a_checkpoints_folder_logs_to_its_run(ppo_run):
    proc = shoal_cli("train", "--resume", str(ppo_run / "checkpoints"), f"total_timesteps={4 * ITERATION}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run_dir"] == str(ppo_run)
    assert not (ppo_run / "checkpoints" / "config.yaml").exists()


def test_a_checkpoint_of_an_algorithm_not_known_here_says_so(ppo_run):
    newest = ckpt.resolve_checkpoint(ppo_run)
    state, meta = ckpt.read_checkpoint(newest)
    state["config"]["algo"] = "my_registered_algo"
    ckpt.write_checkpoint(newest, state, meta)
    with pytest.raises(ckpt.CheckpointError, match=r"cannot be loaded here: .*'my_registered_algo'"):
        shoal.Trainer.from_checkpoint(newest)
