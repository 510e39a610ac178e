"""Run logs: every iteration's record (see ``metrics.log_record``) goes to JSONL, CSV and
TensorBoard, and optionally to Weights & Biases. A resumed run appends to the same files after
dropping the rows logged after its checkpoint, so the logs never hold an iteration twice.
"""

from __future__ import annotations

import csv
import io
import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from shoal.errors import ConfigError
from shoal.files import AppendOnly, write_atomic


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _scalars(record: dict[str, Any]) -> Iterator[tuple[str, int | float]]:
    return ((k, v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


class Writer(Protocol):
    """One log of the run: each iteration's record goes to ``write``."""

    path: Path

    def write(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class JsonlWriter:
    """metrics.jsonl: one line per iteration, each written whole or not at all."""

    def __init__(self, path: Path, resume_iteration: int | None = None):
        if resume_iteration is not None and path.exists():
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("training_iteration", 0) <= resume_iteration
            ]
            write_atomic(path, "".join(line + "\n" for line in kept))
        self.path, self.file = path, AppendOnly(path)

    def write(self, record: dict[str, Any]) -> None:
        # Non-finite floats become null: NaN is not JSON.
        self.file.append(json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n")

    def close(self) -> None:
        self.file.close()


class CsvWriter:
    """progress.csv; if a later record brings new keys, the file is rewritten with the wider header."""

    def __init__(self, path: Path, resume_iteration: int | None = None):
        self.path = path
        self.fields: list[str] = []
        if path.exists() and path.stat().st_size:
            with path.open(newline="") as f:
                reader = csv.DictReader(f)
                rows = list(reader)
                self.fields = list(reader.fieldnames or [])
            if resume_iteration is not None:
                kept = [r for r in rows if float(r.get("training_iteration") or 0) <= resume_iteration]
                self._rewrite(kept, self.fields)

    def write(self, record: dict[str, Any]) -> None:
        new = [k for k in record if k not in self.fields]
        if new:
            rows = []
            if self.path.exists():
                with self.path.open(newline="") as f:
                    rows = list(csv.DictReader(f))
            self._rewrite(rows, self.fields + new)
        row = io.StringIO()
        csv.DictWriter(row, fieldnames=self.fields).writerow(record)
        file = AppendOnly(self.path)  # a row is written whole or not at all
        try:
            file.append(row.getvalue())
        finally:
            file.close()

    def _rewrite(self, rows: list[dict[str, Any]], fields: list[str]) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.path, text.getvalue())
        self.fields = fields  # only once the wider file is in place

    def close(self) -> None:
        pass


class TensorBoardWriter:
    """Scalars against ``timesteps_total``; on resume, events past the checkpoint are purged."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # imported here: it is slow to import

        purge = None if resume_step is None else resume_step + 1
        self.path = run_dir
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge)

    def write(self, record: dict[str, Any]) -> None:
        step = record["timesteps_total"]
        for key, value in _scalars(record):
            if key != "timesteps_total":
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    """Weights & Biases (``pip install 'shoal[wandb]'``). ``wandb_mode='offline'`` needs no account
    or network and writes under the run directory; ``wandb sync`` uploads it later."""

    def __init__(
        self, run_dir: Path, config: dict[str, Any], project: str, mode: Literal["offline", "online"], resume: bool
    ):
        try:
            import wandb
        except ImportError:
            raise ConfigError("wandb_project is set but wandb is not installed: pip install 'shoal[wandb]'.") from None
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:12]
        write_atomic(id_file, run_id)
        self.run = wandb.init(
            project=project,
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
            mode=mode,
            reinit="create_new",
        )
        self.path = run_dir / "wandb"

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(dict(_scalars(record)), step=record["timesteps_total"])

    def close(self) -> None:
        self.run.finish()


class RunLogger:
    """The run directory: config.yaml, metrics.jsonl, progress.csv, TensorBoard events (and W&B).

    ``resume`` is the ``(training_iteration, timesteps_total)`` of the checkpoint a run resumes
    from: rows logged after it are dropped before appending.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: dict[str, Any],
        resume: tuple[int, int] | None = None,
        wandb_project: str | None = None,
        wandb_mode: Literal["offline", "online"] = "offline",
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.yaml", yaml.safe_dump(config, sort_keys=True))
        iteration, step = resume if resume is not None else (None, None)
        self.writers: list[Writer] = [
            JsonlWriter(self.run_dir / "metrics.jsonl", iteration),
            CsvWriter(self.run_dir / "progress.csv", iteration),
            TensorBoardWriter(self.run_dir, step),
        ]
        if wandb_project:
            self.writers.append(WandbWriter(self.run_dir, config, wandb_project, wandb_mode, resume is not None))

    def write(self, record: dict[str, Any]) -> None:
        for w in self.writers:
            try:
                w.write(record)
            except OSError as e:
                e.filename = e.filename or str(w.path)  # a refused write names the file it was for
                raise

    def close(self) -> None:
        """Close every writer, then raise the first error one of them gave (a write it had deferred)."""
        errors = []
        for w in self.writers:
            try:
                w.close()
            except OSError as e:
                e.filename = e.filename or str(w.path)
                errors.append(e)
        if errors:
            raise errors[0]
