"""Writing the run's files so that a failed write (a full disk, a read-only mount) never leaves a
half-written one: whole files are replaced atomically, and appends are undone when they fail."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: readers see the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class AppendOnly:
    """A file that grows by whole records: a record that cannot be written in full (the disk
    filled up half way) is cut off again, so the file ends at the last whole record."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, text: str) -> None:
        data = text.encode("utf-8")
        size = os.fstat(self.fd).st_size
        try:
            written = 0
            while written < len(data):  # a short write comes before the error that explains it
                written += os.write(self.fd, data[written:])
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, size)  # giving space back works on a full disk
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
