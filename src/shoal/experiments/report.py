"""What a sweep shows when it ends: ``results.md`` (per experiment, one row per configuration: its
searched values, the seeds that finished, env steps, the final training return as mean ± std
over seeds, and wall time; best first) and ``<experiment>.png`` (each configuration's learning
curve, mean ± std over its seeds)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from shoal.errors import ConfigError
from shoal.experiments.run import finished
from shoal.experiments.spec import Experiment
from shoal.logging.runs import Run, load_run, plot_runs, resolve_metric


def _trials(out: Path, experiment: Experiment) -> list[tuple[dict[str, Any], Run, bool]]:
    """Each trial of the experiment that has logged an iteration: its params, its run, and
    whether it finished."""
    found = []
    for record in sorted((out / experiment.name).glob("*/trial.json")):
        with contextlib.suppress(ConfigError):  # not started yet
            run = load_run(record.parent)
            found.append((json.loads(record.read_text())["params"], run, finished(record.parent)))
    return found


def experiment_table(out: Path, experiment: Experiment) -> str:
    trials = _trials(out, experiment)
    if not trials:
        return "no trial has logged an iteration yet.\n"
    key = resolve_metric([run for _, run, _ in trials], "episode_reward_mean")
    groups: dict[str, list[tuple[dict[str, Any], Run, bool]]] = {}
    for params, run, done in trials:
        searched = {k: v for k, v in params.items() if k != "seed"}
        groups.setdefault(json.dumps(searched, sort_keys=True, default=str), []).append((params, run, done))
    names = list(json.loads(next(iter(groups))))
    rows = []
    for group in groups.values():
        finals = [_final(run, key) for _, run, _ in group]
        last = [run.rows[-1] for _, run, _ in group]
        mean = float(np.nanmean(finals)) if not all(np.isnan(finals)) else float("nan")
        cells = [_value(group[0][0][name]) for name in names]
        cells += [
            f"{sum(done for *_, done in group)} of {len(group)}",
            f"{np.mean([r.get('timesteps_total') or 0 for r in last]):,.0f}",
            f"{mean:.1f} ± {float(np.nanstd(finals)):.1f}" if not np.isnan(mean) else "-",
            f"{np.mean([r.get('time_total_s') or 0.0 for r in last]):.0f} s",
        ]
        rows.append((mean, cells))
    rows.sort(key=lambda row: -np.inf if np.isnan(row[0]) else -row[0])
    header = [*names, "seeds finished", "steps", "final episode_reward_mean", "wall time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for _, cells in rows]
    return "\n".join(lines) + "\n"


def _final(run: Run, key: str) -> float:
    values = run.series(key)
    values = values[np.isfinite(values)]
    return float(values[-1]) if values.size else float("nan")


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_results(experiments: list[Experiment], out: Path, command: str) -> tuple[Path, list[Path]]:
    """``results.md`` and one plot per experiment (none without matplotlib); returns their paths."""
    parts = [f"# Results\n\nRegenerate with `{command}`.\n"]
    plots = []
    for experiment in experiments:
        stop = ", ".join(f"{k} >= {v:g}" for k, v in experiment.stop.items())
        what = f"{experiment.settings['algo']} on {experiment.settings['env']}"
        parts.append(f"\n## {experiment.name}\n\n{what}; a trial stops at {stop}.\n")
        parts.append("\n" + experiment_table(out, experiment))
        runs = [str(run.path) for _, run, _ in _trials(out, experiment)]
        if runs:
            with contextlib.suppress(ConfigError):  # no matplotlib: the table alone
                plots.append(plot_runs(runs, "episode_reward_mean", "timesteps", out / f"{experiment.name}.png"))
                parts.append(f"\n![{experiment.name}]({experiment.name}.png)\n")
    path = out / "results.md"
    path.write_text("".join(parts))
    return path, plots
