"""What a sweep shows when it ends: ``results.md`` (per experiment, one row per configuration: its
searched values, the seeds that finished (and how many a scheduler or search stopped early, or had
go on from other trials), env steps, the final training return as mean ± std over seeds, and wall
time; best first) and ``<experiment>.png`` (each configuration's learning curve, mean ± std over
its seeds)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from shoal.errors import ConfigError
from shoal.experiments.run import finished, trial_record
from shoal.experiments.spec import Experiment, trials
from shoal.logging.runs import Run, load_run, plot_runs, resolve_metric


def _trials(out: Path, experiment: Experiment) -> list[tuple[dict[str, Any], Run | None, bool]]:
    """Each trial of the experiment (planned, or drawn so far by its search): its params, its run
    (None before it has logged an iteration), and whether it finished."""
    found = []
    for run_dir, params in _trial_dirs(out, experiment):
        run = None
        with contextlib.suppress(ConfigError):  # not started yet
            run = load_run(run_dir)
        found.append((params, run, finished(run_dir)))
    return found


def _trial_dirs(out: Path, experiment: Experiment) -> list[tuple[Path, dict[str, Any]]]:
    folder = out / experiment.name
    if experiment.search is None:
        return [(folder / trial.name, trial.params) for trial in trials(experiment)]
    drawn = sorted(folder.glob("trial_*/trial.json"))  # the table sorts them by return
    return [(path.parent, json.loads(path.read_text())["params"]) for path in drawn]


def experiment_table(out: Path, experiment: Experiment) -> str:
    planned = _trials(out, experiment)
    runs = [run for _, run, _ in planned if run is not None]
    if not runs:
        return "no trial has logged an iteration yet.\n"
    key = resolve_metric(runs, "episode_reward_mean")
    groups: dict[str, list[tuple[dict[str, Any], Run | None, bool]]] = {}
    for params, run, done in planned:
        searched = {k: v for k, v in params.items() if k != "seed"}
        groups.setdefault(json.dumps(searched, sort_keys=True, default=str), []).append((params, run, done))
    names = list(json.loads(next(iter(groups))))
    rows = []
    for group in groups.values():
        started = [run for _, run, _ in group if run is not None]
        finals = [_final(run, key) for run in started]
        last = [run.rows[-1] for run in started]
        mean = float(np.nanmean(finals)) if finals and not all(np.isnan(finals)) else float("nan")
        cells = [_value(group[0][0][name]) for name in names]
        cells += [
            f"{sum(done for *_, done in group)} of {len(group)}" + _moves([trial_record(run.path) for run in started]),
            f"{np.mean([r.get('timesteps_total') or 0 for r in last]):,.0f}" if last else "-",
            f"{mean:.1f} ± {float(np.nanstd(finals)):.1f}" if not np.isnan(mean) else "-",
            f"{np.mean([r.get('time_total_s') or 0.0 for r in last]):.0f} s" if last else "-",
        ]
        rows.append((mean, cells))
    rows.sort(key=lambda row: -np.inf if np.isnan(row[0]) else -row[0])
    header = [*names, "seeds finished", "steps", "final episode_reward_mean", "wall time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for _, cells in rows]
    return "\n".join(lines) + "\n"


def _moves(records: list[dict[str, Any]]) -> str:
    """What schedulers did to a configuration's trials: stopped them early, or had them go on from
    other trials' state (population-based training)."""
    stopped = sum("pruned_at" in r for r in records)
    moved = sum(bool(r.get("exploits")) for r in records)
    notes = [f"{stopped} stopped early"] * bool(stopped) + [f"{moved} went on from better trials"] * bool(moved)
    return f" ({', '.join(notes)})" if notes else ""


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
        runs = [str(run.path) for _, run, _ in _trials(out, experiment) if run is not None]
        if runs:
            with contextlib.suppress(ConfigError):  # no matplotlib: the table alone
                plots.append(plot_runs(runs, "episode_reward_mean", "timesteps", out / f"{experiment.name}.png"))
                parts.append(f"\n![{experiment.name}]({experiment.name}.png)\n")
    path = out / "results.md"
    path.write_text("".join(parts))
    return path, plots
