"""``shoal benchmark``: algorithms x envs x seeds trained as separate ``shoal train`` processes.

As many run at once as asked (default: one per CPU core, each with one torch thread). Every run
has its own directory under ``OUT/runs/<algo>/<env>/seed_<n>``; a run is finished when its
``benchmark.json`` (the summary ``shoal train`` prints, with the deterministic evaluation) is
there. Started again, the command skips finished runs and resumes interrupted ones from their
newest checkpoint, so a long benchmark survives Ctrl-C, a reboot or a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from shoal.config.trainer import load_yaml
from shoal.config.tuned import env_slug
from shoal.errors import ConfigError
from shoal.train.checkpoint import list_checkpoints

RESULT = "benchmark.json"
STOP_GRACE_S = 120.0  # how long an interrupted run may take to write its checkpoint


@dataclass(frozen=True)
class RunSpec:
    """One training run of a benchmark."""

    algo: str
    env: str
    seed: int
    timesteps: int | None = None
    """Env steps (None: the tuned config's total_timesteps, else the default)."""
    overrides: tuple[str, ...] = ()
    """``key=value`` pairs for ``shoal train``."""

    @property
    def name(self) -> str:
        return f"{self.algo}/{self.env} seed {self.seed}"

    def directory(self, out: Path) -> Path:
        return out / "runs" / self.algo / env_slug(self.env) / f"seed_{self.seed}"

    def command(self, out: Path) -> list[str]:
        run_dir = self.directory(out)
        base = [sys.executable, "-m", "shoal", "train", self.env, "--algo", self.algo]
        if list_checkpoints(run_dir / "checkpoints"):  # interrupted before: go on from where it stopped
            return [*base, "--resume", str(run_dir), *self.overrides]
        steps = [] if self.timesteps is None else [f"total_timesteps={self.timesteps}"]
        keys = [f"seed={self.seed}", "torch_threads=1", "verbose=0", *steps, *self.overrides]
        return [*base, *keys, "--run-dir", str(run_dir)]


@dataclass
class Suite:
    """What to run: the runs, and one-line notes on known shortfalls (``algo/env`` -> reason)."""

    runs: list[RunSpec]
    notes: dict[str, str] = field(default_factory=dict)


_SUITE_KEYS = {"seeds", "timesteps", "runs", "notes"}
_RUN_KEYS = {"algo", "env", "timesteps", "overrides", "seeds"}


def load_suite(
    path: str | Path | None,
    algos: list[str] | None = None,
    envs: list[str] | None = None,
    seeds: list[int] | None = None,
    timesteps: int | None = None,
    overrides: list[str] | None = None,
) -> Suite:
    """The runs of a suite file (``seeds``, ``timesteps``, ``runs: [{algo, env[, timesteps,
    overrides, seeds]}]``, ``notes``) and/or of every ``algos`` x ``envs`` pair. Arguments given
    here replace the file's seeds and step budgets; ``algos`` / ``envs`` also filter its runs."""
    data = load_yaml(path) if path is not None else {}
    unknown = set(data) - _SUITE_KEYS
    if unknown:
        raise ConfigError(f"suite '{path}' has unknown keys {sorted(unknown)}; allowed: {sorted(_SUITE_KEYS)}.")
    entries: list[dict[str, Any]] = list(data.get("runs") or [])
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"algo", "env"} <= entry.keys() or set(entry) - _RUN_KEYS:
            raise ConfigError(
                f"suite '{path}': runs[{i}] must be a mapping with algo and env (and optionally "
                f"{sorted(_RUN_KEYS - {'algo', 'env'})}), got {entry!r}."
            )
    if path is None:
        if not algos or not envs:
            raise ConfigError("give a suite file, or --algo and --env (each one or more names).")
        entries = [{"algo": a, "env": e} for e in envs for a in algos]
    else:
        entries = [e for e in entries if (not algos or e["algo"] in algos) and (not envs or e["env"] in envs)]
        if not entries:
            raise ConfigError(f"suite '{path}' has no runs for algo {algos} and env {envs}.")
    runs = []
    for entry in entries:
        steps = timesteps or entry.get("timesteps", data.get("timesteps"))
        extra = tuple(str(pair) for pair in entry.get("overrides", [])) + tuple(overrides or [])
        for seed in seeds or entry.get("seeds") or data.get("seeds") or [1, 2, 3]:
            runs.append(RunSpec(str(entry["algo"]), str(entry["env"]), int(seed), steps, extra))
    return Suite(runs, {str(k): str(v) for k, v in (data.get("notes") or {}).items()})


@dataclass
class RunState:
    spec: RunSpec
    status: str = "waiting"
    """waiting, running, resumed, done, skipped (finished before), failed, stopped."""
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float | None = None
    """How long its process ran this time (None: not started or still running)."""
    detail: str = ""
    _files: list[IO[bytes]] = field(default_factory=list)


def run_suite(suite: Suite, out: str | Path, jobs: int | None = None, live: bool = True) -> list[RunState]:
    """Run every unfinished run of ``suite`` under ``out``, ``jobs`` at a time (default: the CPU
    cores); a live table shows them. Ctrl-C or SIGTERM stops the running ones at their next
    iteration (each writes a checkpoint) and raises KeyboardInterrupt once they have."""
    out = Path(out)
    jobs = jobs or os.cpu_count() or 1
    states = [RunState(spec) for spec in suite.runs]
    for state in states:
        if (state.spec.directory(out) / RESULT).is_file():
            state.status = "skipped"
    pending = [s for s in states if s.status == "waiting"]
    from shoal.benchmark.report import live_table  # rich is imported only for the table

    with live_table(states, out, enabled=live) as refresh, _sigterm_interrupts():
        try:
            while pending or any(s.process for s in states):
                running = [s for s in states if s.process is not None]
                for state in running:
                    _poll(state, out)
                while pending and sum(s.process is not None for s in states) < jobs:
                    _start(pending.pop(0), out)
                refresh()
                time.sleep(0.5)
        except KeyboardInterrupt:
            _stop_all(states, out)
            refresh()
            raise
    return states


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, ``kill``) stops the benchmark as Ctrl-C does."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start(state: RunState, out: Path) -> None:
    run_dir = state.spec.directory(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    command = state.spec.command(out)
    state.status = "resumed" if "--resume" in command else "running"
    stdout, stderr = (run_dir / "stdout.json").open("wb"), (run_dir / "stderr.log").open("ab")
    state._files = [stdout, stderr]
    # a session of its own: Ctrl-C reaches the benchmark, which stops each run in turn
    state.process = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
    state.started = time.monotonic()


def _poll(state: RunState, out: Path) -> None:
    assert state.process is not None
    code = state.process.poll()
    if code is None:
        return
    for f in state._files:
        f.close()
    state.process, state._files = None, []
    state.seconds = time.monotonic() - state.started
    run_dir = state.spec.directory(out)
    summary = _read_summary(run_dir / "stdout.json")
    if code == 0 and summary is not None and summary.get("stop_reason") is None:
        tmp = run_dir / f"{RESULT}.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(run_dir / RESULT)
        state.status = "done"
    elif code in (130, 143):
        state.status = "stopped"
    else:
        state.status = "failed"
        state.detail = f"exit {code}: {_last_line(run_dir / 'stderr.log')} (see {run_dir / 'stderr.log'})"


def _stop_all(states: list[RunState], out: Path) -> None:
    """SIGTERM every running run (each checkpoints at its iteration's end), then wait for them."""
    for state in states:
        if state.process is not None:
            state.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for state in states:
        if state.process is None:
            continue
        try:
            state.process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            state.process.kill()  # its last checkpoint stays; the restart resumes from it
            state.process.wait()
        _poll(state, out)


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""
