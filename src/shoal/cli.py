"""``shoal`` command line: ``train``, ``eval``, ``plot``, ``compare``, ``benchmark``, ``tune``, ``serve``
and ``bench``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from shoal import __version__
from shoal.config import load_yaml, merge_settings, parse_overrides
from shoal.errors import ShoalError

EXIT_CODES: dict[str | None, int] = {"SIGINT": 130, "SIGTERM": 143}  # 128 + signal number, as a shell reports it


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description="Reinforcement learning at speed.")
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train an agent; keys as in the Python config")
    train.add_argument("env", nargs="?", help="Gymnasium env id or a name given to shoal.register_env")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. seed=2 num_envs=16")
    train.add_argument("--config", help="YAML file of config keys (its 'env' key may replace ENV)")
    train.add_argument(
        "--algo",
        help="algorithm: a name (ppo, grpo, dqn, sac, td3, maddpg), or 'package.module:Class' of your own "
        "(the key algo=; default ppo)",
    )
    train.add_argument(
        "--no-tuned",
        action="store_true",
        help="do not start from shoal's tuned config for this algo and env (the key tuned=false)",
    )
    train.add_argument("--run-dir", help="where outputs go (default runs/<name>)")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest good checkpoint"
    )
    train.add_argument(
        "--eval-episodes",
        type=int,
        default=None,
        help="deterministic evaluation episodes after training (default: evaluation_num_episodes)",
    )

    ev = sub.add_parser("eval", help="evaluate a checkpoint (or a run's newest) and print a JSON summary")
    ev.add_argument("path", metavar="RUN_DIR|CHECKPOINT")
    ev.add_argument("--episodes", type=int, default=None, help="episodes, one per env copy (default: the run's)")
    ev.add_argument("--video", action="store_true", help="write each episode as an mp4 (rgb_array rendering)")
    ev.add_argument("--video-dir", help="where the mp4 files go (default: RUN_DIR/videos)")
    ev.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the most likely")
    ev.add_argument("--seed", type=int, default=None, help="seed of the first evaluation env")

    plot = sub.add_parser("plot", help="learning curves of runs as an image (mean and spread over seeds)")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--metric", default="episode_reward_mean", help="a logged key (default episode_reward_mean)")
    plot.add_argument("--x", default="timesteps", choices=["timesteps", "time", "iterations"])
    plot.add_argument("--out", help="image path; its suffix names the format (default: <metric>.png)")

    compare = sub.add_parser("compare", help="table of final and best (highest) values over runs")
    compare.add_argument("runs", nargs="+", metavar="RUN_DIR")
    compare.add_argument("--metric", default="episode_reward_mean")
    suite = sub.add_parser(
        "benchmark",
        help="train algorithms x envs x seeds (resumable) and report them against published returns",
    )
    suite.add_argument("suite", nargs="?", help="YAML file of runs (e.g. benchmarks/suites/readme.yaml)")
    suite.add_argument("overrides", nargs="*", metavar="key=value", help="config keys for every run")
    suite.add_argument("--algo", nargs="+", help="algorithms (with --env instead of a suite, or to pick from it)")
    suite.add_argument("--env", nargs="+", help="env ids (with --algo instead of a suite, or to pick from it)")
    suite.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the suite's, else 1 2 3)")
    suite.add_argument(
        "--timesteps", type=int, help="env steps per run (default: the suite's, else the tuned config's)"
    )
    suite.add_argument("--jobs", type=int, help="runs at once (default: one per CPU core)")
    suite.add_argument("--out", default="runs/benchmark", help="directory of the runs and the report")
    suite.add_argument("--references", help="references file (default: shoal's, configs/references.yaml)")
    tune = sub.add_parser(
        "tune",
        help="run a YAML file of experiments (search spaces, seeds, stop criteria) on Ray Tune, or one trial at a time",
    )
    tune.add_argument("file", help="YAML file of named experiments (docs/scaling.md#experiments)")
    tune.add_argument("--out", help="directory of the trials and the results (default: runs/tune/<file name>)")
    tune.add_argument("--concurrent", type=int, help="trials at once on Tune (default: as the cluster's CPUs allow)")
    tune.add_argument("--sequential", action="store_true", help="one trial after another in this process, no Tune")
    tune.add_argument("--address", help="Ray cluster to run the trials on (default: a local one)")
    serve = sub.add_parser(
        "serve",
        help="a policy server for simulators that call in for actions: training on their episodes, or a checkpoint",
    )
    serve.add_argument(
        "target",
        nargs="?",
        metavar="CONFIG|RUN_DIR|ENV",
        help="a YAML config or env id naming the spaces (trains), or a run directory or checkpoint (serves it)",
    )
    serve.add_argument("overrides", nargs="*", metavar="key=value", help="config keys of the training run")
    serve.add_argument("--algo", help="algorithm of the training run (the key algo=; default ppo)")
    serve.add_argument("--no-tuned", action="store_true", help="do not start from shoal's tuned config")
    serve.add_argument("--run-dir", help="where the training run's outputs go (default runs/<name>)")
    serve.add_argument("--resume", metavar="RUN_DIR", help="continue the served training run in RUN_DIR")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    serve.add_argument("--port", type=int, default=9900, help="port (default 9900; 0 picks a free one)")
    serve.add_argument("--token", help="bearer token clients must send (default: $SHOAL_SERVE_TOKEN)")
    serve.add_argument("--max-requests-per-s", type=float, default=5000.0, help="per connection (default 5000)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request (default 1 MiB)")
    serve.add_argument("--max-wait-ms", type=float, default=2.0, help="checkpoints: how long a batch waits to fill")
    serve.add_argument("--max-batch", type=int, default=256, help="checkpoints: most requests per forward pass")
    serve.add_argument("--explore", action="store_true", help="checkpoints: sample actions, not the most likely")
    bench = sub.add_parser("bench", help="throughput: env-only stepping or end-to-end training")
    what = bench.add_subparsers(dest="bench_command", required=True)
    benv = what.add_parser("env", help="env-only agent steps per second with random actions")
    benv.add_argument("env", help="env id (or module:EnvId, e.g. benchmarks.busy_env:Busy-v0)")
    benv.add_argument("--backend", choices=["serial", "mp"], default="serial")
    benv.add_argument("--num-envs", type=int, default=8)
    benv.add_argument("--num-workers", type=int, default=2, help="worker processes (mp backend)")
    benv.add_argument("--async-factor", type=int, default=1, help="worker groups stepping in turn (mp backend)")
    benv.add_argument("--seconds", type=float, default=5.0)
    btrain = what.add_parser("train", help="end-to-end training steps per second")
    btrain.add_argument("env")
    btrain.add_argument("overrides", nargs="*", metavar="key=value")
    btrain.add_argument("--timesteps", type=int, default=50_000)
    return parser


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
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
            raise ShoalError(f"--algo {args.algo} and algo={settings['algo']} disagree; give one of them.")
        settings["algo"] = args.algo
    if args.no_tuned:
        settings["tuned"] = False
    if args.run_dir:
        settings["run_dir"] = args.run_dir
    if "env" not in settings and not args.resume:
        raise ShoalError("no environment given: pass ENV (e.g. `shoal train CartPole-v1`) or set env in --config.")
    return settings


def train(args: argparse.Namespace) -> int:
    from shoal import distributed
    from shoal.train import Trainer

    settings = _resolve(args)
    if settings.get("backend") == "external":
        raise ShoalError("backend='external' trains on simulators that call in: start it with `shoal serve`.")
    if args.resume:
        settings.setdefault("run_dir", args.resume)
        algo = Trainer.from_checkpoint(args.resume, **settings)
    else:
        algo = Trainer(**settings)
    with algo:
        if algo.run_dir:
            verb = f"resuming at iteration {algo.iteration} in" if args.resume else "writing to"
            print(f"shoal: {verb} {algo.run_dir}", file=sys.stderr)
        result = algo.learn()
        if not distributed.is_main():  # one of several torchrun ranks: rank 0 reports
            return EXIT_CODES.get(algo.stop_reason, 0)
        summary = _summary(algo, result, args.eval_episodes)
    print(json.dumps(summary, indent=2))
    return EXIT_CODES.get(algo.stop_reason, 0)


def _summary(algo: Any, result: dict[str, Any], eval_episodes: int | None) -> dict[str, Any]:
    """What ``train`` and ``serve`` print when a run ends: a finished training run on local envs is
    also evaluated (``eval_episodes``; None: the run's evaluation_num_episodes)."""
    command = "serve" if algo.config.backend == "external" else "train"
    if algo.stop_reason is not None:
        hint = f"; continue with: shoal {command} --resume {algo.run_dir}" if algo.run_dir else ""
        print(f"shoal: stopped ({algo.stop_reason}) at {algo.timesteps_total} steps{hint}", file=sys.stderr)
    finished = algo.stop_reason not in EXIT_CODES
    return {
        "env": algo.env_name,
        "timesteps_total": algo.timesteps_total,
        "time_total_s": round(algo.time_total_s, 2),
        "episode_reward_mean": result.get("episode_reward_mean"),
        "stop_reason": algo.stop_reason,
        "evaluation": algo.evaluate(eval_episodes) if finished and command == "train" else None,
        "run_dir": str(algo.run_dir) if algo.run_dir else None,
    }


def evaluate(args: argparse.Namespace) -> int:
    from shoal.train import Trainer
    from shoal.train.checkpoint import resolve_checkpoint

    checkpoint = resolve_checkpoint(args.path)
    # evaluation steps envs of its own here: a Ray run's workers are not started again
    algo = Trainer.from_checkpoint(
        checkpoint, save_outputs=False, verbose=0, backend="local", ray_address=None, remote_worker_envs=False
    )
    with algo:
        video_dir = None
        if args.video:
            run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint
            video_dir = Path(args.video_dir) if args.video_dir else run_dir / "videos"
        out = algo.evaluate(args.episodes, deterministic=not args.stochastic, seed=args.seed, video_dir=video_dir)
    print(json.dumps({"checkpoint": str(checkpoint), "timesteps_total": algo.timesteps_total, **out}, indent=2))
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
        row = train_sps({"env": args.env, **parse_overrides(args.overrides)}, args.timesteps)
    table = Table(*row.keys(), title=f"shoal bench {args.bench_command}")
    table.add_row(*(f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)
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
    args.config, args.env = (args.target, None) if target is not None and target.is_file() else (None, args.target)
    settings = _resolve(args)
    if args.resume:
        settings.setdefault("run_dir", args.resume)
    trainer, result = serve_training(settings, args.resume, **options)
    print(json.dumps(_summary(trainer, result, None), indent=2))
    return EXIT_CODES.get(trainer.stop_reason, 0)


def tune(args: argparse.Namespace) -> int:
    from shoal.experiments import run_experiments

    out = args.out or str(Path("runs/tune") / Path(args.file).stem)
    words = ["shoal", "tune", args.file, *(["--out", args.out] if args.out else [])]
    command = " ".join(words + (["--sequential"] if args.sequential else []))
    complete = run_experiments(
        args.file, out, args.sequential or None, args.concurrent, args.address, verbose=1, command=command
    )
    return 0 if complete else 1


COMMANDS = {
    "train": train,
    "eval": evaluate,
    "plot": plot,
    "compare": compare,
    "bench": bench,
    "benchmark": benchmark,
    "tune": tune,
    "serve": serve,
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """argparse cannot take key=value pairs after an option (``train ENV --algo x seed=2``): collect
    the pairs wherever they stand."""
    parser = _build_parser()
    args, extra = parser.parse_known_args(argv)
    pairs = [x for x in extra if "=" in x and not x.startswith("-")]
    if len(pairs) < len(extra) or (pairs and not hasattr(args, "overrides")):
        parser.error(
            f"unrecognized arguments: {' '.join(x for x in extra if x not in pairs or not hasattr(args, 'overrides'))}"
        )
    if pairs:
        args.overrides = [*args.overrides, *pairs]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # 'package.module:Name' settings (algo, model, callbacks, envs) name code in the user's project:
    # importable from the working directory, after installed packages so no stray file shadows one
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return COMMANDS[args.command](args)
    except ShoalError as e:
        print(f"shoal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
