"""Result writers: every iteration's result dict goes to JSONL, CSV and TensorBoard."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import yaml

# TensorBoard tags are grouped so related curves sit together; files keep the flat RLlib keys.
_GROUPS = {
    "rollout": ("episode_", "episodes_"),
    "losses": ("policy_loss", "vf_loss", "entropy", "approx_kl", "clipfrac", "explained_variance", "num_sgd"),
    "perf": ("sps", "time_", "sample_time", "learn_time"),
}


def tag_for(key: str) -> str:
    for group, prefixes in _GROUPS.items():
        if key.startswith(prefixes):
            return f"{group}/{key}"
    return f"info/{key}"


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class JsonlWriter:
    def __init__(self, path: Path):
        self.file = path.open("a", encoding="utf-8")

    def write(self, result: dict[str, Any]) -> None:
        # Non-finite floats become null: NaN is not JSON.
        self.file.write(json.dumps({k: _finite_or_none(v) for k, v in result.items()}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class CsvWriter:
    """progress.csv; if a later result brings new keys, the file is rewritten with the wider header."""

    def __init__(self, path: Path):
        self.path = path
        self.fields: list[str] = []
        if path.exists() and path.stat().st_size:
            with path.open(newline="") as f:
                self.fields = next(csv.reader(f), [])

    def write(self, result: dict[str, Any]) -> None:
        new = [k for k in result if k not in self.fields]
        if new:
            rows = []
            if self.path.exists():
                with self.path.open(newline="") as f:
                    rows = list(csv.DictReader(f))
            self.fields += new
            with self.path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.fields)
                writer.writeheader()
                writer.writerows(rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(result)

    def close(self) -> None:
        pass


class TensorBoardWriter:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # imported here: it is slow to import

        self.writer = SummaryWriter(log_dir=str(run_dir))

    def write(self, result: dict[str, Any]) -> None:
        step = result["timesteps_total"]
        for key, value in result.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "timesteps_total":
                self.writer.add_scalar(tag_for(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunLogger:
    """The run directory: config.yaml, metrics.jsonl, progress.csv and TensorBoard events."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=True))
        self.writers = [
            JsonlWriter(self.run_dir / "metrics.jsonl"),
            CsvWriter(self.run_dir / "progress.csv"),
            TensorBoardWriter(self.run_dir),
        ]

    def write(self, result: dict[str, Any]) -> None:
        for w in self.writers:
            w.write(result)

    def close(self) -> None:
        for w in self.writers:
            w.close()
