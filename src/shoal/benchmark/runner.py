"""``shoal benchmark``: algorithms x envs x seeds trained as separate ``shoal train`` processes.

As many run at once as asked (default: one per CPU core, each with one torch thread). Every run
has its own directory under ``OUT/runs/<algo>/<env>/seed_<n>``; a run is finished when its
``benchmark.json`` (the summary ``shoal train`` prints, with the deterministic evaluation) is
there. Started again, the command skips finished runs and resumes interrupted ones from their
newest checkpoint (written every ``CHECKPOINT_EVERY`` iterations), so a long benchmark survives
Ctrl-C, a reboot or a crash. Each directory records its run's settings (another suite's results
are never taken for it) and, while running, the process running it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, cast

from shoal.algos.registry import algorithm_class
from shoal.config.files import parse_overrides
from shoal.config.offline_learners import OfflineConfig
from shoal.config.replay import OffPolicyConfig
from shoal.config.tuned import KINDS, env_slug, kind_path, tuned_path
from shoal.errors import ConfigError, shorten
from shoal.train import signals
from shoal.train.checkpoint import list_checkpoints
from shoal.train.run_state import source_revision
from shoal.yaml_io import load_yaml

RESULT = "benchmark.json"
STOP_GRACE_S = 300.0  # how long an interrupted run may take to end its iteration and write its checkpoint
CHECKPOINT_EVERY = 10  # iterations between a run's checkpoints
SPEC, LOCK = "benchmark_run.json", "benchmark_run.pid"  # in each run's directory
PARTS = "benchmark_parts.jsonl"  # one line per part of a run made in parts: when, and from which source


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

    def identity(self) -> dict[str, Any]:
        """What makes a run this run: kept in its directory, so results of other settings are never
        taken for it."""
        return {
            "algo": self.algo,
            "env": self.env,
            "seed": self.seed,
            "timesteps": self.timesteps,
            "overrides": list(self.overrides),
            "tuned": _tuned_digest(self.algo, self.env, self.overrides),
        }

    def _learns_online_from_replay(self) -> bool:
        """DQN, SAC, TD3, MADDPG: not the on-policy learners, nor the offline ones, whose buffer
        is read again from their datasets. An algo that does not resolve fails in its own run."""
        try:
            config = algorithm_class(self.algo).config_class
        except ConfigError:
            return False
        return issubclass(config, OffPolicyConfig) and not issubclass(config, OfflineConfig)

    def command(self, out: Path) -> list[str]:
        run_dir = self.directory(out)
        base = [sys.executable, "-m", "shoal", "train", self.env, "--algo", self.algo]
        if list_checkpoints(run_dir / "checkpoints"):  # interrupted before: go on from where it stopped
            return [*base, "--resume", str(run_dir)]
        steps = [] if self.timesteps is None else [f"total_timesteps={self.timesteps}"]
        # checkpoints every 10 iterations: a crash or reboot loses little (the keys given win)
        keys = [f"seed={self.seed}", "torch_threads=1", "verbose=0", f"checkpoint_interval={CHECKPOINT_EVERY}"]
        if self._learns_online_from_replay():
            # resumed without its buffer, a replay learner first refills it, which an uninterrupted
            # run would not have done (TD3's returns on BipedalWalker fell from 136 to -94): a row run
            # in parts keeps it
            keys.append("store_buffer_in_checkpoints=true")
        return [*base, *keys, *steps, *self.overrides, "--run-dir", str(run_dir)]


def _tuned_digest(algo: str, env: str, overrides: tuple[str, ...] = ()) -> str | None:
    """A digest of the keys of the tuned config the run starts from, or without one (or with
    ``tuned=false``), of every defaults file its algorithm ships for an env kind (which of them
    applies depends on the env, not made here; none with ``kind_defaults=false``); None: no file.
    A run made before those keys changed is not taken for a run of the new ones. Comments do not
    count."""
    try:
        given = parse_overrides(list(overrides))
    except ConfigError:  # the run itself says what is wrong with them
        given = {}
    path = tuned_path(algo, env) if given.get("tuned", True) is not False else None
    if path is not None:
        keys = load_yaml(path)
    else:
        by_kind = given.get("kind_defaults", True) is not False
        kinds = {kind: found for kind in KINDS if by_kind and (found := kind_path(algo, kind)) is not None}
        if not kinds:
            return None
        keys = {kind: load_yaml(found) for kind, found in kinds.items()}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:12]


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
        raise ConfigError(
            f"suite '{path}' has unknown keys {shorten(str(sorted(unknown)))}; allowed: {sorted(_SUITE_KEYS)}."
        )
    entries: list[dict[str, Any]] = data.get("runs") or []
    if not isinstance(entries, list):
        raise ConfigError(
            f"suite '{path}': runs must be a list of {{algo, env}} mappings, got {shorten(repr(entries))}."
        )
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"algo", "env"} <= entry.keys() or set(entry) - _RUN_KEYS:
            raise ConfigError(
                f"suite '{path}': runs[{i}] must be a mapping with algo and env (and optionally "
                f"{sorted(_RUN_KEYS - {'algo', 'env'})}), got {shorten(repr(entry))}."
            )
    if path is None:
        if not algos or not envs:
            raise ConfigError("give a suite file, or --algo and --env (each one or more names).")
        entries = [{"algo": a, "env": e} for e in envs for a in algos]
    else:
        chosen = [e for e in entries if (not algos or e["algo"] in algos) and (not envs or e["env"] in envs)]
        if not chosen:
            pairs = sorted({f"{e['algo']} on {e['env']}" for e in entries})
            raise ConfigError(
                f"suite '{path}' has no runs for algo {algos} and env {envs}; it has: {', '.join(pairs)}."
            )
        entries = chosen
    runs: dict[tuple[str, str, int], RunSpec] = {}
    for entry in entries:
        where = shorten(f"suite '{path}', {entry['algo']} on {entry['env']}")
        steps = timesteps or entry.get("timesteps", data.get("timesteps"))
        pairs = entry.get("overrides", [])
        run_seeds = seeds or entry.get("seeds") or data.get("seeds") or [1, 2, 3]
        if not isinstance(pairs, list) or not all(isinstance(p, str) and "=" in p for p in pairs):
            raise ConfigError(f"{where}: overrides must be a list of 'key=value' strings, got {shorten(repr(pairs))}.")
        if not isinstance(run_seeds, list) or not all(type(x) is int for x in run_seeds):
            raise ConfigError(f"{where}: seeds must be a list of integers, got {shorten(repr(run_seeds))}.")
        if steps is not None and (type(steps) is not int or steps < 1):
            raise ConfigError(f"{where}: timesteps must be a positive integer, got {shorten(repr(steps))}.")
        for seed in run_seeds:
            spec = RunSpec(str(entry["algo"]), str(entry["env"]), seed, steps, (*pairs, *(overrides or [])))
            key = (spec.algo, spec.env, seed)
            if key in runs:
                raise ConfigError(f"{where}: seed {seed} is listed twice; each run needs a directory of its own.")
            runs[key] = spec
    return Suite(list(runs.values()), {str(k): str(v) for k, v in (data.get("notes") or {}).items()})


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
    stopping: bool = False
    """The benchmark sent it SIGTERM: however its process ends without a result, it was stopped."""
    _files: list[IO[bytes]] = field(default_factory=list)


def run_suite(suite: Suite, out: str | Path, jobs: int | None = None, live: bool = True) -> list[RunState]:
    """Run every unfinished run of ``suite`` under ``out``, ``jobs`` at a time (default: the CPU
    cores); a live table shows them. Ctrl-C or SIGTERM stops the running ones at their next
    iteration (each writes a checkpoint) and raises KeyboardInterrupt once they have."""
    out = Path(out)
    jobs = jobs or os.cpu_count() or 1
    states = [RunState(spec) for spec in suite.runs]
    for state in states:
        _check_directory(state.spec, out)
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
        except BaseException:  # Ctrl-C, SIGTERM, or an error of the benchmark's own: no run goes on alone
            _stop_all(states, out)
            refresh()
            raise
    return states


def _sigterm_interrupts() -> contextlib.AbstractContextManager[None]:
    """SIGTERM (a scheduler's stop, ``kill``) and SIGHUP (the terminal closed) stop the benchmark
    as Ctrl-C does, so no run is left going on its own."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return signals.handling(_stop_signals(signal.SIGTERM, signal.SIGHUP), interrupt)


def _stop_signals(*signums: signal.Signals) -> tuple[signal.Signals, ...]:
    """Those of ``signums`` the process does not ignore: a benchmark started under ``nohup`` goes on
    when its terminal closes."""
    return tuple(s for s in signums if signal.getsignal(s) is not signal.SIG_IGN)


def _check_directory(spec: RunSpec, out: Path) -> None:
    """A run's directory holds this run (or nothing), and no other process is running it."""
    run_dir = spec.directory(out)
    saved = _read_json(run_dir / SPEC)
    expected = spec.identity()
    if saved is not None and "tuned" not in saved:  # written before the tuned config's digest was kept
        del expected["tuned"]
    if saved is not None and saved != expected:
        raise ConfigError(
            f"'{run_dir}' holds {spec.name} run with other settings ({saved}, now {expected}; 'tuned' is "
            f"a digest of the keys of the tuned config or kind defaults it starts from); "
            f"give another --out, or delete the directory to run it again."
        )
    try:
        pid = int((run_dir / LOCK).read_text())
    except (OSError, ValueError):
        return
    if Path(f"/proc/{pid}").exists():
        raise ConfigError(f"'{run_dir}' is being run by process {pid} (another shoal benchmark?); stop it first.")


def _start(state: RunState, out: Path) -> None:
    run_dir = state.spec.directory(out)
    command = state.spec.command(out)
    # held from the part's record on: a stop in between would leave a part that never ran
    with _held_interrupts():
        if "--resume" not in command and run_dir.exists():  # started before, but no checkpoint: anew
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SPEC).write_text(json.dumps(state.spec.identity()))
        state.status = "resumed" if "--resume" in command else "running"
        part = {"started": datetime.now().isoformat(timespec="seconds"), "resumed": "--resume" in command}
        with (run_dir / PARTS).open("a") as parts:
            parts.write(json.dumps(part | {"source": source_revision()}) + "\n")
        stdout, stderr = (run_dir / "stdout.json").open("wb"), (run_dir / "stderr.log").open("ab")
        state._files = [stdout, stderr]
        # a session of its own: Ctrl-C reaches the benchmark, which stops each run in turn
        state.process = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
        state.started = time.monotonic()
        (run_dir / LOCK).write_text(str(state.process.pid))


@contextlib.contextmanager
def _held_interrupts() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held back through the block and raised after it as the
    KeyboardInterrupt they stand for: a run started inside is then always known to the benchmark
    (which stops it with the others) and has its lock file, never left running on its own."""
    held: list[int] = []
    stops = _stop_signals(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    with signals.handling(stops, lambda signum, frame: held.append(signum)):
        yield
    if held:
        raise KeyboardInterrupt


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
    (run_dir / LOCK).unlink(missing_ok=True)
    summary = _read_summary(run_dir / "stdout.json")
    if code == 0 and summary is not None and summary.get("stop_reason") not in ("SIGINT", "SIGTERM"):
        tmp = run_dir / f"{RESULT}.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(run_dir / RESULT)
        state.status = "done"
    elif code in (130, 143) or (state.stopping and code in (-signal.SIGTERM, -signal.SIGKILL)):
        # stopped between iterations; or in its final evaluation, or killed past the grace time
        state.status = "stopped"
    else:
        state.status = "failed"
        state.detail = f"exit {code}: {_last_line(run_dir / 'stderr.log')} (see {run_dir / 'stderr.log'})"


def _stop_all(states: list[RunState], out: Path) -> None:
    """SIGTERM every running run (each checkpoints at its iteration's end) and wait for them; past
    the grace time, or at a second Ctrl-C, kill them (their last checkpoints stay)."""
    running = [s for s in states if s.process is not None]
    for state in running:
        process = cast(subprocess.Popen[bytes], state.process)
        if process.poll() is None:  # not one that ended on its own since it was last polled
            process.send_signal(signal.SIGTERM)
            state.stopping = True
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        for state in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                cast(subprocess.Popen[bytes], state.process).wait(max(deadline - time.monotonic(), 0.1))
    except KeyboardInterrupt:
        pass
    for state in running:
        process = cast(subprocess.Popen[bytes], state.process)
        if process.poll() is None:
            process.kill()
            process.wait()
        _poll(state, out)


def _read_summary(path: Path) -> dict[str, Any] | None:
    """The JSON summary ``shoal train`` prints last (whatever an env printed before it)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start = text.rfind("\n{\n") + 1  # 0 when the summary is all there is
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""
