"""``shoal benchmark``: the suite reader, the references file's errors, and running and resuming
runs (the report and its tables: test_benchmark_report.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from shoal.benchmark import load_references, load_suite, run_suite
from shoal.benchmark.runner import (
    LOCK,
    PARTS,
    RESULT,
    SPEC,
    RunSpec,
    RunState,
    Suite,
    _poll,
    _read_summary,
    _sigterm_interrupts,
    _start,
    _stop_all,
)
from shoal.errors import ConfigError
from shoal.train import checkpoint as ckpt
from shoal.train.run_state import source_revision
from tests.test_benchmark_report import finish


def test_suite_file_runs_are_filtered_and_take_the_seeds_and_budget_given(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(
        "seeds: [1, 2]\ntimesteps: 5000\nruns:\n"
        "  - {algo: ppo, env: CartPole-v1}\n"
        "  - {algo: dqn, env: CartPole-v1, timesteps: 9000, overrides: [gamma=0.9]}\n"
        "notes: {dqn/CartPole-v1: why}\n"
    )
    suite = load_suite(path)
    assert [(r.algo, r.seed, r.timesteps, r.overrides) for r in suite.runs] == [
        ("ppo", 1, 5000, ()),
        ("ppo", 2, 5000, ()),
        ("dqn", 1, 9000, ("gamma=0.9",)),
        ("dqn", 2, 9000, ("gamma=0.9",)),
    ]
    assert suite.notes == {"dqn/CartPole-v1": "why"}
    picked = load_suite(path, algos=["dqn"], seeds=[7], timesteps=100, overrides=["lr_schedule=constant"])
    assert [(r.algo, r.seed, r.timesteps, r.overrides) for r in picked.runs] == [
        ("dqn", 7, 100, ("gamma=0.9", "lr_schedule=constant"))
    ]
    grid = load_suite(None, algos=["ppo", "dqn"], envs=["CartPole-v1", "Acrobot-v1"], seeds=[1])
    assert [(r.env, r.algo) for r in grid.runs] == [
        ("CartPole-v1", "ppo"),
        ("CartPole-v1", "dqn"),
        ("Acrobot-v1", "ppo"),
        ("Acrobot-v1", "dqn"),
    ]
    with pytest.raises(ConfigError, match=r"no runs for algo \['sac'\] .* it has: dqn on CartPole-v1, ppo on CartPole"):
        load_suite(path, algos=["sac"])


def test_bad_suites_and_references_are_named(tmp_path):
    with pytest.raises(ConfigError, match="give a suite file, or --algo and --env"):
        load_suite(None, algos=["ppo"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1]\nruns: []\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['seed'\]"):
        load_suite(bad)
    bad.write_text("runs:\n  - {algo: ppo}\n")
    with pytest.raises(ConfigError, match=r"runs\[0\] must be a mapping with algo and env"):
        load_suite(bad)
    refs = tmp_path / "refs.yaml"
    refs.write_text("references:\n  - {algo: dqn, env: Acrobot-v1, return: -80, steps: 100, source: x}\n")
    with pytest.raises(ConfigError, match="random policy's return for Acrobot-v1"):
        load_references(refs)
    refs.write_text("references:\n  - {algo: dqn, env: CartPole-v1, return: 80, steps: 100, sorce: x}\n")
    with pytest.raises(ConfigError, match="must be a mapping with algo, env, return, steps and source"):
        load_references(refs)


def test_a_run_directory_holds_one_run_and_one_runner(tmp_path):
    spec = RunSpec("ppo", "CartPole-v1", 1, 1000)
    run_dir = spec.directory(tmp_path)
    run_dir.mkdir(parents=True)
    (run_dir / SPEC).write_text(json.dumps(RunSpec("ppo", "CartPole-v1", 1, 5000).identity()))
    with pytest.raises(ConfigError, match="with other settings.*give another --out, or delete the directory"):
        run_suite(Suite([spec]), tmp_path, live=False)
    (run_dir / SPEC).write_text(json.dumps(spec.identity()))
    (run_dir / LOCK).write_text(str(os.getpid()))  # a live process
    with pytest.raises(ConfigError, match=f"is being run by process {os.getpid()}"):
        run_suite(Suite([spec]), tmp_path, live=False)


@pytest.mark.parametrize(
    ("algo", "stored"), [("sac", True), ("td3", True), ("dqn", True), ("ppo", False), ("bc", False), ("dqnn", False)]
)
def test_online_replay_runs_keep_their_buffer_in_checkpoints(tmp_path, algo, stored):
    """A row run in parts resumes with its replay buffer, as the uninterrupted run would have it;
    a misspelt algo is left to fail in its own run, not in the runner."""
    command = RunSpec(algo, "Pendulum-v1", 1).command(tmp_path)
    assert ("store_buffer_in_checkpoints=true" in command) is stored


def test_a_summary_is_read_after_whatever_an_env_printed(tmp_path):
    path = tmp_path / "stdout.json"
    path.write_text('loading {assets}\n{\n  "env": "X",\n  "evaluation": {\n    "a": 1\n  }\n}\n')
    assert _read_summary(path) == {"env": "X", "evaluation": {"a": 1}}
    path.write_text("crashed before printing")
    assert _read_summary(path) is None


def test_suites_refuse_a_run_listed_twice_and_malformed_values(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text("runs:\n  - {algo: ppo, env: CartPole-v1}\n  - {algo: ppo, env: CartPole-v1, seeds: [3]}\n")
    with pytest.raises(ConfigError, match="seed 3 is listed twice"):
        load_suite(path)
    path.write_text("runs:\n  - {algo: ppo, env: CartPole-v1, overrides: gamma=0.9}\n")
    with pytest.raises(ConfigError, match="overrides must be a list of 'key=value' strings, got 'gamma=0.9'"):
        load_suite(path)
    path.write_text("seeds: [1, two]\nruns:\n  - {algo: ppo, env: CartPole-v1}\n")
    with pytest.raises(ConfigError, match=r"seeds must be a list of integers, got \[1, 'two'\]"):
        load_suite(path)


@pytest.mark.slow
def test_interrupted_benchmark_resumes_unfinished_runs_and_skips_finished_ones(tmp_path):
    args = ["--algo", "ppo", "--env", "CartPole-v1", "--out", str(tmp_path), "--timesteps", "60000"]
    args += ["evaluation_num_episodes=2"]
    # first: one seed finishes; then both seeds, the second stopped part way
    first = subprocess.run(
        [sys.executable, "-m", "shoal", "benchmark", *args, "--seeds", "1"], capture_output=True, text=True, timeout=180
    )
    assert first.returncode == 0, first.stderr
    finished = RunSpec("ppo", "CartPole-v1", 1).directory(tmp_path) / RESULT
    stamp = finished.stat().st_mtime_ns
    second = RunSpec("ppo", "CartPole-v1", 2).directory(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "shoal", "benchmark", *args, "--seeds", "1", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (second / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "the same command resumes the unfinished runs" in err
    assert not (second / RESULT).exists() and list((second / "checkpoints").iterdir())
    assert not (second / LOCK).exists()

    # again: the finished seed is not run again, the other goes on from its checkpoint
    suite = load_suite(None, ["ppo"], ["CartPole-v1"], [1, 2], 60_000, ["evaluation_num_episodes=2"])
    states = run_suite(suite, tmp_path, jobs=2, live=False)
    assert [s.status for s in states] == ["skipped", "done"]
    assert finished.stat().st_mtime_ns == stamp
    summary = json.loads((second / RESULT).read_text())
    logged = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert summary["timesteps_total"] == logged[-1]["timesteps_total"] >= 60_000
    assert [row["training_iteration"] for row in logged] == list(range(1, len(logged) + 1))  # resumed, not restarted
    assert "resuming at iteration" in (second / "stderr.log").read_text()
    # each part says which source it ran, and so does each checkpoint
    parts = [json.loads(line) for line in (second / PARTS).read_text().splitlines()]
    assert [p["resumed"] for p in parts] == [False, True]
    assert all(p["source"] == source_revision() for p in parts)
    newest = sorted((second / "checkpoints").iterdir())[-1]
    assert ckpt.read_meta(newest)["source"] == source_revision()


def test_a_run_the_benchmark_stops_outside_an_iteration_is_stopped_not_failed(tmp_path):
    """SIGTERM in a run's final evaluation (no handler there) ends its process by the signal; the
    same command evaluates it again, so it is stopped, as a run stopped between iterations is. A run
    that dies of SIGTERM sent by anyone else failed, and so did one that fails as it stops, or had
    crashed before the stop came."""
    sleeps = "import time; time.sleep(60)"
    fails_on_stop = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(1)); time.sleep(60)"
    crashed = "import sys; sys.exit(3)"
    states = []
    for seed, code in enumerate((sleeps, sleeps, fails_on_stop, crashed)):
        state = RunState(RunSpec("ppo", "CartPole-v1", seed))
        state.spec.directory(tmp_path).mkdir(parents=True)
        state.process = subprocess.Popen([sys.executable, "-c", code])
        states.append(state)
    stopped, killed, failing, gone = states
    gone.process.wait(10)
    time.sleep(0.5)  # the handler is in place
    _stop_all([stopped, failing, gone], tmp_path)
    killed.process.send_signal(signal.SIGTERM)
    killed.process.wait(10)
    _poll(killed, tmp_path)
    assert all(s.process is None for s in states)
    assert [s.status for s in states] == ["stopped", "failed", "failed", "failed"]
    assert "exit -15" in killed.detail and "exit 1" in failing.detail and "exit 3" in gone.detail


@pytest.mark.parametrize("moment", ["recording its part", "making its process"])
def test_a_stop_that_comes_while_a_run_starts_stops_it_with_the_others(tmp_path, monkeypatch, moment):
    """SIGTERM as the run's part is recorded, or as its process is made (it exists, the benchmark
    has not yet taken it in), is held until the benchmark knows the run and its lock file is
    written: the part recorded is a part that ran."""
    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        if not kwargs.get("start_new_session"):  # not the run (git, asked which commit runs)
            return real_popen(command, **kwargs)
        process = real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)
        if moment == "making its process":
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs as this call returns
        return process

    def revision_then_stop():
        os.kill(os.getpid(), signal.SIGTERM)
        return "abc"

    monkeypatch.setattr("shoal.benchmark.runner.subprocess.Popen", popen)
    if moment == "recording its part":
        monkeypatch.setattr("shoal.benchmark.runner.source_revision", revision_then_stop)
    state = RunState(RunSpec("ppo", "CartPole-v1", 1))
    with _sigterm_interrupts(), pytest.raises(KeyboardInterrupt):
        _start(state, tmp_path)
    monkeypatch.undo()
    run_dir = state.spec.directory(tmp_path)
    assert state.process is not None and (run_dir / LOCK).read_text() == str(state.process.pid)
    assert len((run_dir / PARTS).read_text().splitlines()) == 1
    _stop_all([state], tmp_path)
    assert state.status == "stopped" and not (run_dir / LOCK).exists() and state.seconds < 60


def test_a_benchmark_started_under_nohup_goes_on_when_its_terminal_closes():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with _sigterm_interrupts():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_settings_after_the_env_ids_are_settings_and_jobs_must_be_positive(tmp_path, monkeypatch, capsys):
    from shoal.cli import main

    ran = []
    monkeypatch.setattr("shoal.benchmark.run_suite", lambda suite, out, jobs: ran.append(suite) or [])
    out = str(tmp_path / "out")
    argv = ["benchmark", "--algo", "ppo", "--env", "CartPole-v1", "learning_rate=0.001", "--seeds", "1", "--out", out]
    assert main(argv) == 0
    (spec,) = ran[0].runs
    assert (spec.env, spec.overrides) == ("CartPole-v1", ("learning_rate=0.001",))
    assert main([*argv, "--jobs", "0"]) == 2
    assert "--jobs must be at least 1 (runs at once), got 0." in capsys.readouterr().err


def test_a_run_made_before_its_tuned_config_changed_is_not_taken_for_a_current_one(tmp_path, monkeypatch):
    spec = RunSpec("ppo", "CartPole-v1", 1)
    finish(tmp_path, spec, 500.0)
    (spec.directory(tmp_path) / SPEC).write_text(json.dumps(spec.identity()))
    run_suite(Suite([spec]), tmp_path, live=False)  # the same tuned keys: finished, skipped
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("algo: ppo\nenv: CartPole-v1\nlearning_rate: 0.1\n")
    monkeypatch.setattr("shoal.benchmark.runner.tuned_path", lambda algo, env: tuned)
    with pytest.raises(ConfigError, match="holds ppo/CartPole-v1 seed 1 run with other settings"):
        run_suite(Suite([spec]), tmp_path, live=False)


@pytest.mark.parametrize("tuned_off", [False, True])
def test_a_run_made_before_its_kind_defaults_changed_is_not_taken_for_a_current_one(tmp_path, monkeypatch, tuned_off):
    """Without a tuned config, or with ``tuned=false``, a run starts from its algorithm's defaults
    for the env's kind: those are what its identity follows, not a tuned config it does not read."""
    defaults, tuned = tmp_path / "box.yaml", tmp_path / "tuned.yaml"
    defaults.write_text("learning_rate: 0.0003\n")
    tuned.write_text("learning_rate: 0.1\n")
    monkeypatch.setattr("shoal.benchmark.runner.tuned_path", lambda algo, env: tuned if tuned_off else None)
    monkeypatch.setattr("shoal.benchmark.runner.kind_path", lambda algo, kind: defaults if kind == "box" else None)
    spec = RunSpec("ppo", "Walker2d-v5", 1, overrides=("tuned=false",) if tuned_off else ())
    finish(tmp_path, spec, 500.0)
    (spec.directory(tmp_path) / SPEC).write_text(json.dumps(spec.identity()))
    run_suite(Suite([spec]), tmp_path, live=False)  # the same defaults: finished, skipped
    defaults.write_text("# a comment changes nothing\nlearning_rate: 0.0003\n")
    tuned.write_text("learning_rate: 0.2\n")  # read by neither run
    run_suite(Suite([spec]), tmp_path, live=False)
    defaults.write_text("learning_rate: 0.001\n")
    with pytest.raises(ConfigError, match="holds ppo/Walker2d-v5 seed 1 run with other settings"):
        run_suite(Suite([spec]), tmp_path, live=False)
