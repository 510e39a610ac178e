"""``shoal`` command line: ``shoal train ENV [--config FILE] [key=value ...]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shoal.config import load_yaml, parse_overrides
from shoal.errors import ShoalError

ALGOS = {"ppo": "PPO"}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description="Reinforcement learning at speed.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an agent; keys as in the Python config")
    train.add_argument("env", nargs="?", help="Gymnasium env id or a name given to shoal.register_env")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. seed=2 num_envs=16")
    train.add_argument("--config", help="YAML file of config keys (its 'env' key may replace ENV)")
    train.add_argument("--algo", default="ppo", choices=sorted(ALGOS))
    train.add_argument("--run-dir", help="where outputs go (default runs/<name>)")
    train.add_argument("--eval-episodes", type=int, default=None,
                       help="deterministic evaluation episodes after training (default: evaluation_num_episodes)")
    return parser


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = load_yaml(args.config) if args.config else {}
    pairs = list(args.overrides)
    env = args.env
    if env and "=" in env:  # `shoal train --config f.yaml seed=3`: the first pair landed in ENV
        pairs.insert(0, env)
        env = None
    settings.update(parse_overrides(pairs))
    if env:
        settings["env"] = env
    if args.run_dir:
        settings["run_dir"] = args.run_dir
    if "env" not in settings:
        raise ShoalError("no environment given: pass ENV (e.g. `shoal train CartPole-v1`) or set env in --config.")
    return settings


def train(args: argparse.Namespace) -> int:
    import shoal

    settings = _resolve(args)
    algo_cls = getattr(shoal, ALGOS[args.algo])
    with algo_cls(**settings) as algo:
        if algo.run_dir:
            print(f"shoal: writing to {algo.run_dir}", file=sys.stderr)
        result = algo.learn()
        summary = {
            "env": algo.env_name,
            "timesteps_total": result.get("timesteps_total"),
            "time_total_s": round(algo.time_total_s, 2),
            "episode_reward_mean": result.get("episode_reward_mean"),
            "evaluation": algo.evaluate(args.eval_episodes),
            "run_dir": str(algo.run_dir) if algo.run_dir else None,
        }
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return train(args)
    except ShoalError as e:
        print(f"shoal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
