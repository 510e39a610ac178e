"""Experiments (``run_experiments``): a YAML file of named experiments with search
spaces, seeds and stop criteria, run on Ray Tune when it is installed and one trial after another
otherwise, resumable, with a results table and a comparison plot at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from shoal.experiments.report import write_results
from shoal.experiments.run import run_on_tune, run_sequential
from shoal.experiments.spec import Experiment, Space, Trial, load_experiments, trials

__all__ = ["Experiment", "Space", "Trial", "load_experiments", "run_experiments", "trials"]


def tune_installed() -> bool:
    try:
        import ray.tune  # noqa: F401 (only whether it imports)
    except ImportError:
        return False
    return True


def run_experiments(
    source: str | Path | dict[str, Any],
    out: str | Path = "runs/tune",
    *,
    sequential: bool | None = None,
    concurrent: int | None = None,
    address: str | None = None,
    verbose: int = 1,
    command: str | None = None,
) -> bool:
    """Run the experiments of a file (or of the same mapping) into ``out`` and write
    ``results.md`` and a plot per experiment there; running it again resumes. ``sequential``:
    one trial after another in this process (default: only when Ray Tune is not installed).
    Returns whether every trial finished (False: interrupted, or a trial failed)."""
    experiments = load_experiments(source)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if sequential is None:
        sequential = not tune_installed()
        if sequential and verbose:
            print(
                "shoal: Ray Tune is not installed (pip install 'shoal[ray]'): trials run one at a time.",
                file=sys.stderr,
            )
    complete = (
        run_sequential(experiments, out, verbose) if sequential else run_on_tune(experiments, out, concurrent, address)
    )
    if command is None:
        command = "run_experiments(...)" if isinstance(source, dict) else f"shoal tune {source}"
    table, plots = write_results(experiments, out, command)
    if verbose:
        print(table.read_text(), end="")
        done = "" if complete else "; some trials did not finish: the same command resumes them"
        print(f"shoal: wrote {table}{''.join(f' and {p}' for p in plots)}{done}", file=sys.stderr)
    return complete
