"""``shoal bench``: env-only and end-to-end training throughput, printed as a table; and the
learning-curve runs the scripts under ``benchmarks/`` share.

Env-only stepping sends fixed random actions (drawn once, cycled), so the figure is the
backend's ceiling: what training could reach if inference and learning were free.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from shoal.files import save_figure
from shoal.train.callbacks import Callback
from shoal.vector import make_backend

if TYPE_CHECKING:
    from shoal.train import Trainer

Curve = list[tuple[int, float]]  # (env steps, mean deterministic evaluation return)


def env_sps(
    env: str, num_envs: int, num_workers: int = 0, async_factor: int = 1, seconds: float = 5.0, seed: int = 0
) -> dict[str, Any]:
    """Agent steps per second of a backend stepping ``env`` with random actions."""
    backend = make_backend(env, num_envs, num_workers=num_workers, async_factor=async_factor)
    try:
        space = backend.act_spec.space
        bank = torch.as_tensor(
            np.stack([np.stack([space.sample() for _ in range(backend.num_rows)]) for _ in range(16)])
        )
        backend.reset(seed)
        for _ in range(async_factor):  # start every group stepping
            batch = backend.recv()
            backend.send(bank[0][batch.rows])
        steps, i = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch = backend.recv()
            i = (i + 1) % len(bank)
            backend.send(bank[i][batch.rows])
            steps += len(batch.env_id)
        elapsed = time.perf_counter() - start
    finally:
        backend.close()
    return {
        "env": env,
        "backend": "mp" if num_workers else "serial",
        "num_envs": num_envs,
        "num_workers": num_workers,
        "async_factor": async_factor,
        "sps": steps / elapsed,
        "seconds": elapsed,
    }


def train_sps(settings: dict[str, Any], timesteps: int) -> dict[str, Any]:
    """End-to-end training steps per second over ``timesteps`` env steps (no outputs written)."""
    from shoal.train import Trainer

    with Trainer(**{**settings, "save_outputs": False, "verbose": 0}) as algo:
        start = time.perf_counter()
        result = algo.learn(timesteps)
        elapsed = time.perf_counter() - start
        c = algo.config
    return {
        "env": algo.env_name,
        "num_envs": c.num_envs,
        "num_workers": c.num_workers,
        "timesteps": algo.timesteps_total,
        "sps": algo.timesteps_total / elapsed,
        "seconds": elapsed,
        "episode_reward_mean": result.get("episode_reward_mean"),
    }


def seed_sweep_args(description: str, **options: tuple[type, Any]) -> tuple[Any, dict[str, Any]]:
    """Command-line arguments of a benchmark run over seeds: ``--seeds``, the given options (name
    -> (type, default); ``eval_every`` is written ``--eval-every``) and ``key=value`` config
    overrides. Returns the parsed arguments and the overrides (printed when there are any)."""
    import argparse

    from shoal.config import parse_overrides

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    for name, (kind, default) in options.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=default)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    overrides = parse_overrides(args.overrides)
    if overrides:
        print("settings:", " ".join(args.overrides))
    return args, overrides


class EvalCurve(Callback):
    """Evaluates ``episodes`` deterministic episodes whenever another ``every`` env steps are in,
    and keeps the time it took, so the training's own wall time can be told apart."""

    def __init__(self, every: int, episodes: int = 10):
        self.every, self.next, self.episodes, self.seconds = every, every, episodes, 0.0
        self.curve: Curve = []

    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> None:
        if trainer.timesteps_total >= self.next:
            start = time.perf_counter()
            self.curve.append((trainer.timesteps_total, trainer.evaluate(self.episodes)["episode_reward_mean"]))
            self.seconds += time.perf_counter() - start
            self.next += self.every


def learning_curve(
    preset: type[Trainer], settings: dict[str, Any], steps: int, eval_every: int, level: float
) -> dict[str, Any]:
    """One ``learn(steps)`` run of ``preset(**settings)`` (its learning-rate schedule spans the
    budget) with its evaluation curve, the final 20-episode evaluation, the training's own wall
    time, and the env steps at which an evaluation first reached ``level`` and from which every
    later one did."""
    curve = EvalCurve(eval_every)
    settings = {**settings, "callbacks": [*settings.get("callbacks", []), curve]}  # the run's own ones first
    with preset(**settings, save_outputs=False, verbose=0) as algo:
        curve.curve.append((0, algo.evaluate(curve.episodes)["episode_reward_mean"]))  # before the clock starts
        start = time.perf_counter()
        algo.learn(steps)
        wall = time.perf_counter() - start - curve.seconds
        final = algo.evaluate(20)
        curve.curve.append((algo.timesteps_total, final["episode_reward_mean"]))
        return {
            "steps": algo.timesteps_total,
            "wall": wall,
            "eval": final["episode_reward_mean"],
            "eval_min": final["episode_reward_min"],
            "curve": curve.curve,
            "first": next((t for t, r in curve.curve if r >= level), None),
            "held": held_from(curve.curve, level),
        }


CURVE_WIDTHS = (6, 4, 8, 9, 10, 9, 13, 14)


def curve_header(level: float) -> str:
    """The header of a table of ``learning_curve`` runs, one row per run (``curve_row``)."""
    cells = ("run", "seed", "steps", "wall (s)", "eval mean", "eval min", f"first >= {level:g}", f"always >= {level:g}")
    return " ".join(f"{c:>{w}}" for c, w in zip(cells, CURVE_WIDTHS)) + "  solved"


def curve_row(name: str, seed: int, out: dict[str, Any], level: float) -> str:
    first, held = ("-" if out[k] is None else f"{out[k]:,}" for k in ("first", "held"))
    cells = (
        name,
        seed,
        f"{out['steps']:,}",
        f"{out['wall']:.1f}",
        f"{out['eval']:.1f}",
        f"{out['eval_min']:.1f}",
        first,
        held,
    )
    solved = "yes" if out["eval"] >= level else "NO"
    return " ".join(f"{c:>{w}}" for c, w in zip(cells, CURVE_WIDTHS)) + f"  {solved}"


def print_curves(results: dict[str, list[dict[str, Any]]], seeds: list[int]) -> None:
    """Every run's evaluation curve as one line of ``env steps: mean return`` points."""
    print("curves (env steps: deterministic evaluation return):")
    for name, runs in results.items():
        for seed, out in zip(seeds, runs):
            points = "  ".join(f"{steps:,}: {ret:.0f}" for steps, ret in out["curve"])
            print(f"  {name} seed {seed}: {points}")


def report_curves(
    results: dict[str, list[dict[str, Any]]], seeds: list[int], plot: str | None, title: str, level: float
) -> None:
    """Print the learning curves of ``learning_curve`` runs and, given ``plot`` (a path), draw them
    to a PNG with ``level`` as a dotted line."""
    print_curves(results, seeds)
    if plot:
        plot_curves(results, plot, title, level)
        print(f"plot: {plot}")


def sweep_seeds(
    preset: type[Trainer],
    runs: dict[str, Callable[[int], dict[str, Any]]],
    args: Any,
    level: float,
    title: str,
) -> dict[str, list[dict[str, Any]]]:
    """``learning_curve`` of each named run (``runs[name](seed)`` gives its settings) for every
    seed of ``args`` (``seed_sweep_args``' ``seeds``, ``steps``, ``eval_every``, ``plot``), a printed
    row each as it ends, then the curves, with ``args.plot`` their plot, and each run's final
    evaluation over the seeds."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    print(curve_header(level))
    for name, settings in runs.items():
        for seed in args.seeds:
            out = learning_curve(preset, settings(seed), args.steps, args.eval_every, level)
            results[name].append(out)
            print(curve_row(name, seed, out, level), flush=True)
    report_curves(results, args.seeds, args.plot, title, level)
    for name, outs in results.items():
        finals = [out["eval"] for out in outs]
        print(f"{name}: final evaluation {np.mean(finals):.2f} ± {np.std(finals):.2f} over {len(finals)} seeds")
    return results


def held_from(curve: Curve, level: float) -> int | None:
    """The env steps from which every evaluation of ``curve`` reached ``level`` (None: not at the end)."""
    held = None
    for steps, ret in reversed(curve):
        if ret < level:
            break
        held = steps
    return held


def plot_curves(results: dict[str, list[dict[str, Any]]], path: str, title: str, level: float) -> None:
    """Each named set of runs' evaluation curves as one line, the mean over seeds (on a shared
    grid of env steps, each seed's curve held at its last value in between), shaded from min to
    max, with ``level`` dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, runs in results.items():
        grid = np.linspace(0, max(r["curve"][-1][0] for r in runs), 200)
        ys = []
        for r in runs:
            steps, returns = zip(*r["curve"])
            index = np.searchsorted(np.array(steps), grid, side="right") - 1
            ys.append(np.array(returns)[np.clip(index, 0, None)])
        stack = np.stack(ys)
        line = ax.plot(grid, stack.mean(0), label=f"{name} (mean of {len(runs)} seeds)")[0]
        ax.fill_between(grid, stack.min(0), stack.max(0), color=line.get_color(), alpha=0.2)
    ax.axhline(level, color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("deterministic evaluation return")
    ax.set_title(title)
    if level > 0:  # returns from 0 up to the level (CartPole-like tasks); otherwise as they fall
        ax.set_ylim(0, level * 1.1)
    ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        save_figure(fig, Path(path), dpi=120)
    finally:
        plt.close(fig)
