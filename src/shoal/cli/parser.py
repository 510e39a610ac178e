"""The ``shoal`` command line's arguments: one parser per command, and ``key=value`` config pairs
taken wherever they stand."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from shoal import __version__

# what add_subparsers returns, a class argparse names privately
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """argparse cannot take key=value pairs after an option (``train ENV --algo x seed=2``): collect
    the pairs wherever they stand."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    pairs = [x for x in extra if "=" in x and not x.startswith("-")]
    if len(pairs) < len(extra) or (pairs and not hasattr(args, "overrides")):
        parser.error(
            f"unrecognized arguments: {' '.join(x for x in extra if x not in pairs or not hasattr(args, 'overrides'))}"
        )
    if pairs:
        args.overrides = [*args.overrides, *pairs]
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description="Reinforcement learning at speed.")
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in (_train, _eval, _export, _plot_and_compare, _benchmark, _tune, _serve, _bench, _dataset):
        add_command(sub)
    return parser


def _train(sub: Subparsers) -> None:
    """``shoal train``: a run from an env id, a config file and key=value pairs, or a resume."""
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
        help="do not start from shoal's tuned config for this algo and env (the key tuned=false); the defaults "
        "for the env's kind still apply (kind_defaults=false leaves them out too)",
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


def _eval(sub: Subparsers) -> None:
    """``shoal eval``: a checkpoint's evaluation episodes, optionally filmed."""
    ev = sub.add_parser("eval", help="evaluate a checkpoint (or a run's newest) and print a JSON summary")
    ev.add_argument("path", metavar="RUN_DIR|CHECKPOINT")
    ev.add_argument("--episodes", type=int, default=None, help="episodes, one per env copy (default: the run's)")
    ev.add_argument("--video", action="store_true", help="write each episode as an mp4 (rgb_array rendering)")
    ev.add_argument("--video-dir", help="where the mp4 files go (default: RUN_DIR/videos)")
    ev.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the most likely")
    ev.add_argument("--seed", type=int, default=None, help="seed of the first evaluation env")


def _export(sub: Subparsers) -> None:
    """``shoal export``: a checkpoint's policy as a file that acts without shoal."""
    ex = sub.add_parser("export", help="write a checkpoint's policy (or a run's newest) as ONNX or TorchScript")
    ex.add_argument("path", metavar="RUN_DIR|CHECKPOINT")
    ex.add_argument(
        "out", metavar="FILE", nargs="?", help="the file to write, .onnx or .pt (default: RUN_DIR/policy.<format>)"
    )
    ex.add_argument("--format", choices=["onnx", "torchscript"], help="the format (default: as FILE's suffix says)")
    ex.add_argument("--policy", default=None, help="the policy id (required when the run has several)")


def _plot_and_compare(sub: Subparsers) -> None:
    """``shoal plot`` and ``shoal compare``: runs' learning curves, and a table of them."""
    plot = sub.add_parser("plot", help="learning curves of runs as an image (mean and spread over seeds)")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--metric", default="episode_reward_mean", help="a logged key (default episode_reward_mean)")
    plot.add_argument("--x", default="timesteps", choices=["timesteps", "time", "iterations"])
    plot.add_argument("--out", help="image path; its suffix names the format (default: <metric>.png)")

    compare = sub.add_parser("compare", help="table of final and best (highest) values over runs")
    compare.add_argument("runs", nargs="+", metavar="RUN_DIR")
    compare.add_argument("--metric", default="episode_reward_mean")


def _benchmark(sub: Subparsers) -> None:
    """``shoal benchmark``: a suite of runs, reported against published returns."""
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


def _tune(sub: Subparsers) -> None:
    """``shoal tune``: a file of experiments, on Ray Tune or one trial at a time."""
    tune = sub.add_parser(
        "tune",
        help="run a YAML file of experiments (search spaces, seeds, stop criteria) on Ray Tune, or one trial at a time",
    )
    tune.add_argument("file", help="YAML file of named experiments (docs/scaling.md#experiments)")
    tune.add_argument("--out", help="directory of the trials and the results (default: runs/tune/<file name>)")
    tune.add_argument("--concurrent", type=int, help="trials at once on Tune (default: as the cluster's CPUs allow)")
    tune.add_argument("--sequential", action="store_true", help="one trial after another in this process, no Tune")
    tune.add_argument("--address", help="Ray cluster to run the trials on (default: a local one)")


def _serve(sub: Subparsers) -> None:
    """``shoal serve``: a policy server, training on simulators' episodes or serving a checkpoint."""
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


def _dataset(sub: Subparsers) -> None:
    """``shoal dataset``: what a dataset folder holds."""
    dataset = sub.add_parser("dataset", help="offline datasets (Minari's layout): summarize one, record a policy")
    what = dataset.add_subparsers(dest="dataset_command", required=True)
    info = what.add_parser("info", help="spaces, shards, episodes, steps and return statistics per policy")
    info.add_argument("path", help="a run's output folder, a policy's folder or one Minari dataset")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rec = what.add_parser("record", help="a trained policy's whole episodes, written as a dataset")
    rec.add_argument("path", help="a run directory or checkpoint")
    rec.add_argument("--episodes", type=int, required=True, help="whole episodes to record of each policy")
    rec.add_argument("--out", required=True, help="the dataset folder to write")
    rec.add_argument("--explore", action="store_true", help="act as in training (sampling, epsilon, noise)")
    rec.add_argument("--seed", type=int, help="seed of the envs and the policies' draws (default: the run's)")


def _bench(sub: Subparsers) -> None:
    """``shoal bench``: throughput, env-only or end to end."""
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
