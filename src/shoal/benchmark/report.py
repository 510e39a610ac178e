"""What a benchmark shows: the live table while it runs, then ``benchmark.md`` (one row per
algorithm and env, judged against the published reference) and ``benchmark.png`` (a grid of
learning curves, one panel per env, the references drawn as dashed lines)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shoal.benchmark.references import SHARE, References
from shoal.errors import ConfigError
from shoal.files import refused_writes, save_figure, write_atomic
from shoal.logging.runs import learning_curves, load_run, resolve_metric
from shoal.yaml_io import load_yaml

if TYPE_CHECKING:
    from shoal.benchmark.runner import RunState, Suite

COLUMNS = ("env", "algo", "steps", "return", "seeds", "wall time", "SPS", "reference", "vs reference")


@contextlib.contextmanager
def live_table(states: list[RunState], out: Path, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A table of the runs (status, steps, latest training return, time), redrawn on each call
    of the function it yields."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def render() -> Table:
        table = Table("run", "status", "steps", "return", "time", title=f"shoal benchmark: {out}")
        for state in states:
            if state.status == "waiting":
                continue
            steps, ret = _progress(state.spec.directory(out))
            elapsed = time.monotonic() - state.started if state.process is not None else state.seconds
            table.add_row(
                state.spec.name,
                state.status if not state.detail else f"{state.status}: {state.detail}",
                "-" if steps is None else f"{steps:,}",
                "-" if ret is None else f"{ret:.1f}",
                "-" if elapsed is None else f"{elapsed:.0f} s",
            )
        waiting = sum(s.status == "waiting" for s in states)
        if waiting:
            table.caption = f"{waiting} more waiting"
        return table

    if not enabled:
        yield lambda: None
        return
    with Live(render(), console=Console(stderr=True), refresh_per_second=1) as live:
        yield lambda: live.update(render())


def _progress(run_dir: Path) -> tuple[int | None, float | None]:
    """The newest logged env steps and training return of a run (None before its first iteration)."""
    path = run_dir / "metrics.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(max(path.stat().st_size - 8192, 0))
            lines = f.read().decode(errors="replace").splitlines()
        row = json.loads(lines[-1])
    except (OSError, IndexError, json.JSONDecodeError):
        return None, None
    ret = row.get("rollout/episode_reward_mean")
    return row.get("timesteps_total"), None if ret is None else float(ret)


@dataclass
class Row:
    """One algorithm on one env over its seeds."""

    env: str
    algo: str
    seeds: int
    returns: list[float]
    """Each finished seed's mean deterministic evaluation return."""
    steps: list[int]
    budgets: list[int]
    """Each finished seed's ``total_timesteps``: the budget asked for (the last iteration may overrun it)."""
    seconds: list[float]
    """Each finished seed's training time."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan


def collect_rows(suite: Suite, out: Path) -> list[Row]:
    """The finished runs' summaries, one row per (env, algo): grouped by env family (``FAMILIES``),
    then in the order the suite first lists each env and each algo on it."""
    from shoal.benchmark.runner import RESULT

    rows: dict[tuple[str, str], Row] = {}
    for spec in suite.runs:
        row = rows.setdefault((spec.env, spec.algo), Row(spec.env, spec.algo, 0, [], [], [], []))
        row.seeds += 1
        path = spec.directory(out) / RESULT
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        row.returns.append(float(summary["evaluation"]["episode_reward_mean"]))
        row.steps.append(int(summary["timesteps_total"]))
        config = load_yaml(spec.directory(out) / "config.yaml")
        row.budgets.append(int(config.get("total_timesteps", summary["timesteps_total"])))
        row.seconds.append(float(summary["time_total_s"]))
    env_order = {env: i for i, env in enumerate(dict.fromkeys(env for env, _ in rows))}
    families = {env: FAMILIES.index(env_family(env)) for env in env_order}
    return sorted(
        rows.values(), key=lambda row: (families[row.env], env_order[row.env])
    )  # stable: algos keep their order


FAMILIES = ("classic control", "Box2D", "MuJoCo", "MinAtar", "Atari", "multi-agent", "other")
"""The table's groups of envs, in its order."""

_FAMILY_MODULES = {"classic_control": "classic control", "box2d": "Box2D", "mujoco": "MuJoCo"}


def env_family(env: str) -> str:
    """Which of ``FAMILIES`` an env id belongs to: by its prefix, else by the gymnasium package that
    registers it."""
    if env.startswith(("pettingzoo:", "vmas:")):
        return "multi-agent"
    name = env.split(":")[-1]  # gymnasium's "module:EnvId" form imports the module first
    if name.startswith("MinAtar/"):
        return "MinAtar"
    if name.startswith("ALE/"):
        return "Atari"
    import gymnasium

    try:
        entry_point = gymnasium.spec(name).entry_point
    except gymnasium.error.Error:  # not registered (yet): an env of a package not imported here
        return "other"
    module = entry_point if isinstance(entry_point, str) else getattr(entry_point, "__module__", "")
    parts = module.split(":")[0].split(".")
    if parts[:2] == ["gymnasium", "envs"] and len(parts) > 2:
        return _FAMILY_MODULES.get(parts[2], "other")
    return "other"


def table_cells(row: Row, references: References, reason: str | None = None) -> list[str]:
    """The cells of ``row`` in ``COLUMNS`` order; ``reason`` stands for the row's reasons, which
    ``row_reasons`` gives (a note's marker, as in ``markdown_table``)."""
    tail = f" ({reason})" if reason else ""
    if not row.returns:
        return [
            row.env,
            row.algo,
            "-",
            "-",
            f"0 of {row.seeds}",
            "-",
            "-",
            _reference(row, references),
            "not run" + tail,
        ]
    steps = float(np.mean(row.steps))
    sps = float(np.mean([s / t for s, t in zip(row.steps, row.seconds)]))
    spread = f" ± {_tenths(float(np.std(row.returns)))}" if len(row.returns) > 1 else ""
    score = references.score(row.algo, row.env, row.mean)
    return [
        row.env,
        row.algo,
        _count(steps),
        f"{_tenths(row.mean)}{spread}",
        f"{len(row.returns)}" if len(row.returns) == row.seeds else f"{len(row.returns)} of {row.seeds}",
        _duration(float(np.mean(row.seconds))),
        f"{sps:,.0f}",
        _reference(row, references),
        ("no reference" if score is None else f"{math.floor(100 * score)}%: {_verdict(row, references)}") + tail,
    ]  # 89.6% shows as 89%: it does not meet 90%


def _reference(row: Row, references: References) -> str:
    ref = references.published.get((row.algo, row.env))
    return "-" if ref is None else f"{ref.value:g} @ {_count(ref.steps)} ({ref.source})"


def _verdict(row: Row, references: References) -> str:
    """``meets`` when the row reaches 90% of its reference (``SHARE``) on a budget no larger than
    the reference's steps, every seed finished; else ``short``."""
    ref = references.published[(row.algo, row.env)]
    score = references.score(row.algo, row.env, row.mean)
    meets = score is not None and score >= SHARE and max(row.budgets) <= ref.steps and len(row.returns) == row.seeds
    return "meets" if meets else "short"


def row_reasons(row: Row, references: References, note: str | None) -> str | None:
    """Why a row is as it is, in words (None: it meets its reference and has no note): the suite's
    note, a budget past the reference's steps, unfinished seeds, a return below 90%."""
    reasons = [note] if note else []
    ref = references.published.get((row.algo, row.env))
    if row.returns and ref is not None:
        if max(row.budgets) > ref.steps:
            reasons.append(f"a budget of {_count(max(row.budgets))}, more than the reference's {_count(ref.steps)}")
        if len(row.returns) < row.seeds:
            reasons.append(f"{row.seeds - len(row.returns)} seed(s) unfinished")
        score = references.score(row.algo, row.env, row.mean)
        if score is not None and score < SHARE:
            reasons.append(f"below {100 * SHARE:.0f}% of the reference")
    elif row.returns:
        reasons = reasons or ["no published reference"]
    return "; ".join(reasons) or None


def _tenths(value: float) -> str:
    return f"{round(value, 1) + 0.0:.1f}"  # -0.04 rounds to -0.0; adding 0.0 makes it 0.0


def _count(steps: float) -> str:
    return f"{steps / 1e6:.3g}M" if steps >= 1e6 else f"{steps / 1e3:.3g}k"


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def markdown_table(rows: list[Row], references: References, notes: dict[str, str]) -> tuple[str, list[str]]:
    """The table, a bold row heading each env family, and its notes: each row that has reasons
    (``row_reasons``) cites a numbered note (``note 3``) instead of holding them, so no cell runs
    long. Returns the table and the notes' texts, note 1 first."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    texts: list[str] = []
    family = None
    for row in rows:
        if env_family(row.env) != family:
            family = env_family(row.env)
            lines.append(f"| **{family}** |" + " |" * (len(COLUMNS) - 1))
        reason = row_reasons(row, references, notes.get(f"{row.algo}/{row.env}"))
        if reason is not None:
            texts.append(f"{row.algo} on {row.env}: {reason}.")
        marker = None if reason is None else f"note {len(texts)}"
        lines.append("| " + " | ".join(c.replace("|", "/") for c in table_cells(row, references, marker)) + " |")
    return "\n".join(lines) + "\n", texts


def notes_list(texts: list[str]) -> str:
    """The notes ``markdown_table`` returned, as a numbered markdown list."""
    return "".join(f"{i}. {text}\n" for i, text in enumerate(texts, 1))


def write_report(suite: Suite, out: Path, references: References, command: str) -> tuple[Path, Path | None]:
    """Write ``benchmark.md`` (headed by the ``command`` that regenerates it) and, with
    matplotlib installed, ``benchmark.png``; returns their paths."""
    table, texts = markdown_table(collect_rows(suite, out), references, suite.notes)
    text = (
        "Final return: mean over seeds of each run's deterministic evaluation after training; ± is the\n"
        "population std over seeds. Steps: env steps run, whose last iteration may pass the budget\n"
        "asked for (1.02M for 1M); the verdict compares that budget with the reference's steps.\n"
        "Wall time: training time per run; SPS: env steps per second of training.\n"
        f"Regenerate with:\n\n```bash\n{command}\n```\n\n{table}"
        + (f"\nNotes:\n\n{notes_list(texts)}" if texts else "")
    )
    md = out / "benchmark.md"
    with refused_writes("the benchmark table", md):
        out.mkdir(parents=True, exist_ok=True)  # nothing ran (interrupted at once): the table still says so
        write_atomic(md, text)
    try:
        png: Path | None = plot_grid(suite, out, references)
    except ConfigError:  # no matplotlib: the table alone
        png = None
    return md, png


def plot_grid(suite: Suite, out: Path, references: References) -> Path:
    """One panel per env: each algorithm's training return (mean ± std over seeds) against env
    steps, with its published reference as a dashed line of the same color."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("the benchmark plot needs matplotlib: pip install 'shoal[plot]'.") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(spec.env for spec in suite.runs))
    colors = {algo: f"C{i}" for i, algo in enumerate(dict.fromkeys(spec.algo for spec in suite.runs))}  # one per algo
    cols = min(3, len(envs))
    nrows = math.ceil(len(envs) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), dpi=110, squeeze=False)
    for ax, env in zip(axes.flat, envs):
        algos = list(dict.fromkeys(spec.algo for spec in suite.runs if spec.env == env))
        for algo in algos:
            color = colors[algo]
            _plot_algo(ax, [s.directory(out) for s in suite.runs if s.env == env and s.algo == algo], algo, color)
            ref = references.published.get((algo, env))
            if ref is not None:
                ax.axhline(ref.value, color=color, linestyle="--", linewidth=1, label=f"{algo} reference")
        ax.set_title(env, fontsize="medium")
        ax.set_xlabel("env steps")
        ax.xaxis.set_major_formatter(lambda x, _: _count(x) if x >= 1000 else f"{x:g}")  # 200k, not 200000
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # not before any run of the env has logged
            ax.legend(fontsize="x-small", loc="best")
    for ax in list(axes.flat)[len(envs) :]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("training return")
    fig.tight_layout()
    path = out / "benchmark.png"
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return path


def _plot_algo(ax: Any, run_dirs: list[Path], algo: str, color: str) -> None:
    runs = []
    for run_dir in run_dirs:
        with contextlib.suppress(ConfigError):  # not started, or no iteration logged yet
            runs.append(load_run(run_dir))
    if not runs:
        return
    key = resolve_metric(runs, "episode_reward_mean")
    for curve in learning_curves(runs, key, "timesteps_total"):
        ax.plot(curve.x, curve.mean, color=color, label=f"{algo} ({curve.runs} seed{'s' * (curve.runs > 1)})")
        if curve.runs > 1:
            ax.fill_between(
                curve.x, curve.mean - curve.std, curve.mean + curve.std, color=color, alpha=0.2, linewidth=0
            )
