"""Reading finished (or running) run directories back: learning-curve plots and comparison tables."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.errors import ConfigError, did_you_mean
from shoal.files import save_figure
from shoal.logging.metrics import log_key
from shoal.yaml_io import load_yaml

X_KEYS = {"timesteps": "timesteps_total", "time": "time_total_s", "iterations": "training_iteration"}
# Keys that name or place a run rather than change what it learns: runs differing only in these
# are seeds of one configuration.
_NOT_CONFIG = {
    "seed",
    "name",
    "run_dir",
    "verbose",
    "save_outputs",
    "callbacks",
    "wandb_project",
    "wandb_mode",
    "checkpoint_interval",
    "keep_checkpoints",
}


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]

    def series(self, key: str) -> npt.NDArray[np.float64]:
        return np.array([math.nan if r.get(key) is None else r[key] for r in self.rows], dtype=float)

    @property
    def settings(self) -> dict[str, Any]:
        """The keys that change what the run learns, without those at their default: a run written
        before a key existed and one that records the key's default are one configuration."""
        defaults = _defaults(self.config.get("algo"))
        return {
            k: v
            for k, v in self.config.items()
            if k not in _NOT_CONFIG and not (k in defaults and _same(defaults[k], v))
        }

    @property
    def group(self) -> str:
        return json.dumps(self.settings, sort_keys=True, default=str)


def _same(a: Any, b: Any) -> bool:
    """Equal once both are written as YAML would load them back (tuples as lists, enums as text)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _defaults(algo: Any) -> dict[str, Any]:
    """The config keys' defaults for ``algo`` as config.yaml names it; none for an algorithm this
    process cannot import (its keys then all count)."""
    from shoal.algos.registry import algorithm_class  # the algorithms import far more than reading runs needs

    try:
        cls = algorithm_class(algo).config_class
    except ConfigError:
        return {}
    return {
        field.alias or name: field.get_default(call_default_factory=True)
        for name, field in cls.model_fields.items()
        if not field.is_required()
    }


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"'{path}' is not a run directory: it has no metrics.jsonl.")
    config_file = path / "config.yaml"
    config = load_yaml(config_file) if config_file.is_file() else {}
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        raise ConfigError(f"run '{path}' has not logged an iteration yet.")
    return Run(path, config, rows)


def resolve_metric(runs: list[Run], metric: str) -> str:
    """The logged key for ``metric`` (``episode_reward_mean`` and ``rollout/episode_reward_mean`` both work)."""
    known = set().union(*(row.keys() for r in runs for row in r.rows))  # periodic keys (evaluation/...) included
    for candidate in (metric, log_key(metric)):
        if candidate in known:
            return candidate
    raise ConfigError(
        f"no metric '{metric}' in these runs.{did_you_mean(metric, sorted(known))} "
        f"Logged keys: {', '.join(sorted(known))}."
    )


def _group_label(group: list[Run], groups: list[list[Run]]) -> str:
    """What sets this group apart from the others (or the env when there is one group)."""
    cfg = group[0].settings
    if len(groups) > 1:
        others = [g[0].settings for g in groups]
        keys = sorted(set().union(*others))
        differing = [k for k in keys if any(not _same(o.get(k), cfg.get(k)) for o in others)]
        if differing:
            defaults = _defaults(group[0].config.get("algo"))
            return ", ".join(f"{k}={cfg.get(k, defaults.get(k))}" for k in differing[:3])
    return str(group[0].config.get("env", group[0].path.name))


@dataclass
class Curve:
    label: str
    x: npt.NDArray[np.float64]
    mean: npt.NDArray[np.float64]
    std: npt.NDArray[np.float64]
    runs: int


def learning_curves(runs: list[Run], key: str, x_key: str) -> list[Curve]:
    """One curve per configuration: the mean over its runs and their std, on a shared x grid."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    curves = []
    for group in groups.values():
        series = []
        for run in group:
            xs, ys = run.series(x_key), run.series(key)
            ok = np.isfinite(xs) & np.isfinite(ys)
            if ok.any():
                series.append((xs[ok], ys[ok]))
        if not series:
            continue
        # Runs log at different x values: compare them where all of them have data.
        lo, hi = max(sx[0] for sx, _ in series), min(sx[-1] for sx, _ in series)
        grid = np.linspace(lo, hi, 200) if hi > lo else np.array([lo])
        ys = np.stack([np.interp(grid, sx, sy) for sx, sy in series])
        curves.append(Curve(_group_label(group, list(groups.values())), grid, ys.mean(0), ys.std(0), len(series)))
    return curves


def plot_runs(paths: list[str], metric: str, x: str, out: str | Path) -> Path:
    """Write a PNG of ``learning_curves``: each configuration's mean with a ±1 std band."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'shoal[plot]'.") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    if x not in X_KEYS:
        raise ConfigError(f"--x must be one of {', '.join(X_KEYS)}, got '{x}'.")
    runs = [load_run(p) for p in paths]
    key, x_key = resolve_metric(runs, metric), X_KEYS[x]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for curve in learning_curves(runs, key, x_key):
        (line,) = ax.plot(curve.x, curve.mean, label=f"{curve.label} ({curve.runs} run{'s' * (curve.runs > 1)})")
        if curve.runs > 1:
            ax.fill_between(
                curve.x, curve.mean - curve.std, curve.mean + curve.std, color=line.get_color(), alpha=0.25, linewidth=0
            )
    ax.set_xlabel(x_key)
    ax.set_ylabel(key)
    ax.set_title(f"{key}: mean ± std over runs")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    try:
        return save_figure(fig, Path(out))
    finally:
        plt.close(fig)


def compare_runs(paths: list[str], metric: str) -> tuple[str, list[dict[str, Any]]]:
    """The logged key of ``metric``, and one row per run: its config basics and the final and
    best (highest) value of the metric."""
    runs = [load_run(p) for p in paths]
    key = resolve_metric(runs, metric)
    eval_key = "evaluation/episode_reward_mean"
    table = []
    for run in runs:
        values = run.series(key)
        finite = values[np.isfinite(values)]
        evals = run.series(eval_key) if any(eval_key in r for r in run.rows) else np.array([])
        evals = evals[np.isfinite(evals)]
        last = run.rows[-1]
        table.append(
            {
                "run": str(run.path),
                "env": run.config.get("env"),
                "seed": run.config.get("seed"),
                "timesteps_total": last.get("timesteps_total"),
                "time_total_s": round(last.get("time_total_s") or 0.0, 1),
                "final": float(finite[-1]) if finite.size else None,
                "best": float(finite.max()) if finite.size else None,
                "final evaluation": float(evals[-1]) if evals.size else None,
            }
        )
    return key, table
