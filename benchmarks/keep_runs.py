"""Copy the finished runs of a ``shoal benchmark`` output directory into one kept in the repository.

A row at its reference's full budget can take longer than a machine lives, and ``runs/`` is not
kept with the repository. What the table and its curves need of a finished run (its summary,
settings, parts and metrics: a few hundred KB) is copied; checkpoints and logs are not. Runs not
finished yet are left where they are.

    python benchmarks/keep_runs.py runs/full-sac-llc benchmarks/records/readme

``shoal benchmark SUITE --algo A --env E --out benchmarks/records/readme`` then skips the kept runs
and writes their table (``benchmark.md``) and curves.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from shoal.benchmark.runner import PARTS, RESULT, SPEC

KEPT = (RESULT, SPEC, PARTS, "config.yaml", "metrics.jsonl", "run.json")


def keep_finished(out: Path, kept: Path) -> list[Path]:
    """Copy the kept files of every finished run under ``out`` to the same place under ``kept``;
    returns the runs copied (relative to ``out``)."""
    copied = []
    for result in sorted(out.glob(f"runs/*/*/seed_*/{RESULT}")):
        run_dir = result.parent
        relative = run_dir.relative_to(out)
        (kept / relative).mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, kept / relative / name)
        copied.append(relative)
    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a shoal benchmark --out directory")
    parser.add_argument("kept", type=Path, help="where the finished runs are kept")
    args = parser.parse_args()
    if not (args.out / "runs").is_dir():
        raise SystemExit(f"'{args.out}' holds no runs/ directory: give a shoal benchmark --out directory.")
    copied = keep_finished(args.out, args.kept)
    for relative in copied:
        print(f"kept {relative}")
    if not copied:
        print(f"no finished run under '{args.out}' yet")


if __name__ == "__main__":
    main()
