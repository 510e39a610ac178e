"""``shoal`` command line: ``train``, ``eval``, ``plot``, ``compare``, ``benchmark``, ``tune``, ``serve``
and ``bench``, each a function of the parsed arguments (``shoal.cli.parser``) returning the exit code."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from shoal.cli.parser import parse
from shoal.errors import ConfigError, ShoalError, ShoalWarning

# Everything heavier (torch, the configs, the trainer) is imported by the command that needs it, so
# that `shoal --version` and `shoal --help` answer at once.

EXIT_CODES: dict[str | None, int] = {"SIGINT": 130, "SIGTERM": 143}  # 128 + signal number, as a shell reports it


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    from shoal.config import load_yaml, merge_settings, parse_overrides
    from shoal.errors import shorten

    settings: dict[str, Any] = load_yaml(args.config) if args.config else {}
    pairs = list(args.overrides)
    env = args.env
    if env and "=" in env:  # `shoal train --config f.yaml seed=3`: the first pair landed in ENV
        pairs.insert(0, env)
        env = None
    settings = merge_settings(settings, parse_overrides(pairs))
    if env:
        settings["env"] = env
    if args.algo:
        if "algo" in settings and settings["algo"] != args.algo:
            raise ShoalError(
                f"--algo {shorten(args.algo)} and algo={shorten(str(settings['algo']))} disagree; give one of them."
            )
        settings["algo"] = args.algo
    if args.no_tuned:
        settings["tuned"] = False
    if args.run_dir:
        settings["run_dir"] = args.run_dir
    if "env" not in settings and not args.resume and settings.get("input", "sampler") == "sampler":
        raise ShoalError(
            "no environment given: pass ENV (e.g. `shoal train CartPole-v1`), set env in --config, or learn from "
            "datasets with input=DIR."
        )
    return settings


def train(args: argparse.Namespace) -> int:
    from shoal import distributed
    from shoal.train import Trainer

    settings = _resolve(args)
    if settings.get("backend") == "external":
        raise ShoalError("backend='external' trains on simulators that call in: start it with `shoal serve`.")
    if args.resume:
        settings.setdefault("run_dir", _run_dir_of(args.resume))
        algo = Trainer.from_checkpoint(args.resume, **settings)
    else:
        algo = Trainer(**settings)
    with algo:
        if algo.run_dir:
            verb = f"resuming at iteration {algo.iteration} in" if args.resume else "writing to"
            print(f"shoal: {verb} {algo.run_dir}", file=sys.stderr)
        if algo.timesteps_total >= algo.config.total_timesteps:
            print(
                f"shoal: the run is at {algo.timesteps_total} steps, its budget (total_timesteps="
                f"{algo.config.total_timesteps}); give a larger total_timesteps to train on.",
                file=sys.stderr,
            )
        result = algo.learn()
        if not distributed.is_main():  # one of several torchrun ranks: rank 0 reports
            return EXIT_CODES.get(algo.stop_reason, 0)
        summary = _summary(algo, result, args.eval_episodes)
    print(json.dumps(summary, indent=2))
    return EXIT_CODES.get(algo.stop_reason, 0)


def _run_dir_of(resume: str) -> str:
    """The run directory ``--resume`` names: the run a checkpoint (or checkpoints folder) lives in,
    else the path itself."""
    from shoal.train.lineage import run_dir_of

    return str(run_dir_of(Path(resume)) or resume)


def _number(value: Any) -> Any:
    """A float JSON can hold: NaN (no episode ended, as when reading datasets) becomes null."""
    return None if isinstance(value, float) and value != value else value


def _summary(algo: Any, result: dict[str, Any], eval_episodes: int | None) -> dict[str, Any]:
    """What ``train`` and ``serve`` print when a run ends: a finished training run on local envs is
    also evaluated (``eval_episodes``; None: the run's evaluation_num_episodes), one with no env not;
    a run with ``off_policy_estimation_methods`` also gives their estimates of its final policy."""
    from shoal.train.run_state import stop_reason

    command = "serve" if algo.config.backend == "external" else "train"
    if algo.stop_reason is not None:
        hint = f"; continue with: shoal {command} --resume {algo.run_dir}" if algo.run_dir else ""
        print(f"shoal: stopped ({algo.stop_reason}) at {algo.timesteps_total} steps{hint}", file=sys.stderr)
    done = algo.stop_reason not in EXIT_CODES
    finished = done and algo.config.env is not None
    estimates = algo.estimate_off_policy() if done and algo.config.off_policy_estimation_methods else None
    return {
        "env": algo.env_name,
        "timesteps_total": algo.timesteps_total,
        "time_total_s": round(algo.time_total_s, 2),
        "episode_reward_mean": _number(result.get("episode_reward_mean")),
        "stop_reason": stop_reason(algo),
        "evaluation": algo.evaluate(eval_episodes) if finished and command == "train" else None,
        "off_policy_estimation": None if estimates is None else {k: _number(v) for k, v in estimates.items()},
        "run_dir": str(algo.run_dir) if algo.run_dir else None,
    }


LOCAL_ENVS: dict[str, Any] = {
    "backend": "local",
    "ray_address": None,
    "remote_worker_envs": False,
    "off_policy_estimation_methods": [],
}
"""What a checkpoint loads with to act here: envs of its own in this process (a Ray run's workers
are not started again), and no off-policy estimates."""


def evaluate(args: argparse.Namespace) -> int:
    from shoal.train import Trainer
    from shoal.train.checkpoint import resolve_checkpoint
    from shoal.train.lineage import run_dir_of

    checkpoint = resolve_checkpoint(args.path)
    algo = Trainer.from_checkpoint(checkpoint, save_outputs=False, verbose=0, **LOCAL_ENVS)
    with algo:
        video_dir = None
        if args.video:
            video_dir = Path(args.video_dir) if args.video_dir else (run_dir_of(checkpoint) or checkpoint) / "videos"
        out = algo.evaluate(args.episodes, deterministic=not args.stochastic, seed=args.seed, video_dir=video_dir)
    print(json.dumps({"checkpoint": str(checkpoint), "timesteps_total": algo.timesteps_total, **out}, indent=2))
    return 0


def export(args: argparse.Namespace) -> int:
    from shoal.train import Trainer
    from shoal.train.checkpoint import resolve_checkpoint
    from shoal.train.lineage import run_dir_of

    if args.out is None and args.format is None:
        raise ConfigError("name the file to write (FILE), or its format (--format onnx or torchscript).")
    checkpoint = resolve_checkpoint(args.path)
    out = args.out or (run_dir_of(checkpoint) or checkpoint.parent) / "policy"  # e.g. runs/<run>/policy.onnx
    with Trainer.from_checkpoint(checkpoint, save_outputs=False, verbose=0, **LOCAL_ENVS) as algo:
        path = algo.export_policy(out, args.policy, args.format)
    print(f"shoal: wrote {path}, the policy of {checkpoint}")
    return 0


def plot(args: argparse.Namespace) -> int:
    from shoal.logging.runs import plot_runs

    out = args.out or f"{args.metric.replace('/', '_')}.png"
    print(f"shoal: wrote {plot_runs(args.runs, args.metric, args.x, out)}")
    return 0


def compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from shoal.logging.runs import compare_runs

    key, rows = compare_runs(args.runs, args.metric)
    table = Table(title=f"{key}: final and best over {len(rows)} runs")
    for column in rows[0]:
        table.add_column(column, no_wrap=column == "run")
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console(width=200).print(table)
    return 0


def bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from shoal.bench import env_sps, train_sps

    if args.bench_command == "env":
        workers = args.num_workers if args.backend == "mp" else 0
        row = env_sps(args.env, args.num_envs, workers, args.async_factor if workers else 1, args.seconds)
    else:
        from shoal.config import parse_overrides

        row = train_sps({"env": args.env, **parse_overrides(args.overrides)}, args.timesteps)
    table = Table(*row.keys(), title=f"shoal bench {args.bench_command}")
    table.add_row(*(f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)
    return 0


def dataset(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from shoal.offline.info import dataset_summary

    if args.dataset_command == "record":
        from shoal.train.recording import record_dataset

        written = record_dataset(args.path, args.out, args.episodes, explore=args.explore, seed=args.seed)
        for pid, counts in written.items():
            print(f"shoal: wrote {counts['episodes']} episodes ({counts['steps']:,} steps) of {pid} to {args.out}")
        return 0
    rows = dataset_summary(Path(args.path))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        table = Table("", "", title=f"{args.path}: {row.pop('policy')}", show_header=False)
        for key, value in row.items():
            text = "n/a" if value is None else f"{value:,.2f}" if isinstance(value, float) else value
            table.add_row(key, f"{value:,}" if isinstance(value, int) else text)
        Console(width=120).print(table)
    return 0


def _benchmark_command(args: argparse.Namespace) -> str:
    """The command line that regenerates this benchmark's report."""
    words = ["shoal", "benchmark", *([args.suite] if args.suite else []), *args.overrides]
    for flag in ("algo", "env", "seeds"):
        if getattr(args, flag):
            words += [f"--{flag}", *map(str, getattr(args, flag))]
    for flag in ("timesteps", "jobs", "references"):
        if getattr(args, flag):
            words += [f"--{flag}", str(getattr(args, flag))]
    if args.out != "runs/benchmark":
        words += ["--out", args.out]
    return shlex.join(words)


def benchmark(args: argparse.Namespace) -> int:
    from shoal.benchmark import load_references, load_suite, run_suite, write_report
    from shoal.benchmark.references import REFERENCES_FILE

    if args.suite and "=" in args.suite:  # `shoal benchmark --algo a --env e seed=1`: a pair landed in SUITE
        args.overrides, args.suite = [args.suite, *args.overrides], None
    for option in ("algo", "env"):  # --env takes several ids, so pairs after it land there: they are settings
        values = getattr(args, option) or []
        args.overrides = [*args.overrides, *(v for v in values if "=" in v)]
        setattr(args, option, [v for v in values if "=" not in v] or None)
    if args.jobs is not None and args.jobs < 1:
        raise ShoalError(f"--jobs must be at least 1 (runs at once), got {args.jobs}.")

    suite = load_suite(args.suite, args.algo, args.env, args.seeds, args.timesteps, args.overrides)
    references = load_references(args.references or REFERENCES_FILE)  # a bad file fails before any run
    out = Path(args.out)
    command = _benchmark_command(args)
    interrupted = False
    try:
        states = run_suite(suite, out, args.jobs)
    except KeyboardInterrupt:
        interrupted, states = True, []
    md, png = write_report(suite, out, references, command)
    print(md.read_text())
    print(f"shoal: wrote {md}" + (f" and {png}" if png else ""), file=sys.stderr)
    if interrupted:
        print("shoal: interrupted; the same command resumes the unfinished runs", file=sys.stderr)
        return 130
    failed = [s for s in states if s.status == "failed"]
    for state in failed:
        print(f"shoal: {state.spec.name} failed: {state.detail}", file=sys.stderr)
    return 1 if failed else 0


def serve(args: argparse.Namespace) -> int:
    from shoal.serve import checkpoint_server, serve_training

    options = {
        "host": args.host,
        "port": args.port,
        "token": args.token or os.environ.get("SHOAL_SERVE_TOKEN"),
        "max_requests_per_s": args.max_requests_per_s,
        "max_body_bytes": args.max_body_bytes,
    }
    target = Path(args.target) if args.target else None
    if target is not None and (target.is_dir() or target.suffix == ".pt"):
        if args.overrides or args.resume:
            raise ShoalError("a served checkpoint learns nothing: key=value settings and --resume are for training.")
        server = checkpoint_server(target, args.max_batch, args.max_wait_ms, not args.explore, **options)
        with server:
            print(f"shoal: serving {target} at {server.url} (inference only; Ctrl-C stops)", file=sys.stderr)
            threading.Event().wait()
        return 0
    # a path that is not there (an env id such as 'MinAtar/Breakout-v1' names no folder that exists)
    looks_like_path = target is not None and (
        target.suffix in (".yaml", ".yml", ".pt")
        or str(target).startswith((".", "/", "~"))
        or (target.parent != Path(".") and target.parent.is_dir())
    )
    if target is not None and looks_like_path and not target.exists():
        raise ShoalError(
            f"'{target}' does not exist: shoal serve takes a run directory or checkpoint (inference), a config file, "
            f"or an env id (training)."
        )
    args.config, args.env = (args.target, None) if target is not None and target.is_file() else (None, args.target)
    settings = _resolve(args)
    if args.resume:
        settings.setdefault("run_dir", _run_dir_of(args.resume))
    trainer, result = serve_training(settings, args.resume, **options)
    print(json.dumps(_summary(trainer, result, None), indent=2))
    return EXIT_CODES.get(trainer.stop_reason, 0)


def tune(args: argparse.Namespace) -> int:
    from shoal.experiments import run_experiments

    out = args.out or str(Path("runs/tune") / Path(args.file).stem)
    words = ["shoal", "tune", args.file, *(["--out", args.out] if args.out else [])]
    command = " ".join(words + (["--sequential"] if args.sequential else []))
    complete = run_experiments(
        args.file,
        out,
        sequential=args.sequential or None,
        concurrent=args.concurrent,
        address=args.address,
        verbose=1,
        command=command,
    )
    return 0 if complete else 1


COMMANDS = {
    "train": train,
    "eval": evaluate,
    "export": export,
    "plot": plot,
    "compare": compare,
    "bench": bench,
    "benchmark": benchmark,
    "tune": tune,
    "serve": serve,
    "dataset": dataset,
}


def _format_warning(message: Warning | str, category: type[Warning], *where: Any, **kwargs: Any) -> str:
    """On the command line shoal's own warnings read as its messages do, without a source line."""
    if issubclass(category, ShoalWarning):
        return f"shoal: warning: {message}\n"
    return _python_format_warning(message, category, *where, **kwargs)


_python_format_warning = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # 'package.module:Name' settings (algo, model, callbacks, envs) name code in the user's project:
    # importable from the working directory, after installed packages so no stray file shadows one
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    warnings.formatwarning = _format_warning
    try:
        return COMMANDS[args.command](args)
    except ShoalError as e:
        print(f"shoal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # a run's message (RunInterrupted) says what it kept
        print(f"shoal: {e or 'interrupted'}", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = _python_format_warning
