"""What the schedulers and the search share: a JSON book beside the trials, read and written under
a file lock so that trials running at once on this machine (on Tune) see each other's entries;
and reading a result's progress and metric."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoal.errors import did_you_mean, warn
from shoal.files import write_atomic


@contextlib.contextmanager
def locked_json(path: Path, empty: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The book at ``path`` (``empty`` when there is none yet), held under a lock while the block
    reads and changes it; written back, atomically, if it changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.is_file() else json.dumps(empty)
        book = json.loads(text)
        yield book
        if book != json.loads(text):
            write_atomic(path, json.dumps(book, indent=1))


class Reading:
    """A scheduler's reading of each result: its progress (``time_attr``) and its ``metric``, or
    nothing while the metric is missing (no episode ended yet) or not a number. A metric the
    results never hold is warned about once: it would judge nothing, silently."""

    def __init__(self, block: str, metric: str, time_attr: str):
        self.block, self.metric, self.time_attr = block, metric, time_attr
        self.warned = False

    def __call__(self, result: dict[str, Any]) -> tuple[float, float] | None:
        if not self.warned and self.metric not in result:
            self.warned = True
            keys = sorted(k for k, v in result.items() if isinstance(v, (int, float)))
            hint = did_you_mean(self.metric, keys)
            warn(f"{self.block}.metric '{self.metric}' is not in the trials' results, so it judges no trial.{hint}")
        progress, value = result.get(self.time_attr), result.get(self.metric)
        if progress is None or not isinstance(value, (int, float)) or math.isnan(value):
            return None
        return float(progress), float(value)
