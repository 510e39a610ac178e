"""Writing the run's files so that a failed write (a full disk, a read-only mount) never leaves a
half-written one: whole files are replaced atomically, and appends are undone when they fail;
and ``refused_writes``, which turns such a failure into one ``OutputError`` that says so."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shoal.errors import OutputError

# What a filesystem answers when a file cannot be written: out of space or quota, read-only,
# no permission, file too large, a failing device.
REFUSED_WRITE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO})


def refused_write(error: BaseException) -> OSError | None:
    """The filesystem's refusal behind ``error``, if there is one: torch.save reports a full disk as
    a RuntimeError raised while handling the OSError, so the whole chain is searched."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in REFUSED_WRITE:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def free_space(path: Path) -> str:
    """The free space of the filesystem that holds ``path`` (which may not exist yet), for people."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            free = float(shutil.disk_usage(folder).free)
            for unit in ("bytes", "KB", "MB", "GB"):
                if free < 1024 or unit == "GB":
                    return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
                free /= 1024
    return "unknown space"


@contextlib.contextmanager
def refused_writes(
    what: str, path: Path | None, within: Path | None = None, kept: Callable[[], str] | None = None
) -> Iterator[None]:
    """Turn a refused write of ``what`` (at ``path``) into one ``OutputError`` naming the file and
    the free space there, then ``kept()`` (what survived, how to go on). With ``within``, only
    refusals of files under it count (an env's own file errors pass through)."""
    try:
        yield
    except OutputError:
        raise
    except Exception as e:
        refusal = refused_write(e)
        if refusal is None or (
            within is not None and not Path(os.fsdecode(refusal.filename or "")).is_relative_to(within)
        ):
            raise
        where = Path(os.fsdecode(refusal.filename)) if refusal.filename else (path or Path.cwd())
        then = "" if kept is None else " " + kept()
        raise OutputError(
            f"could not write {what} '{where}': {refusal.strerror} ({free_space(where)} free there now).{then}"
        ) from e


def write_atomic(path: Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content`` (text is written as UTF-8): readers see the old file or the
    new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = content.encode() if isinstance(content, str) else content
    try:
        with tmp.open("wb") as f:
            f.write(data)
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


def save_figure(figure: Any, path: Path, **options: Any) -> Path:
    """Write a matplotlib ``figure`` in the format its suffix names (PNG without one; ``options``
    go to ``savefig``) in one rename, so a refused write leaves no broken image, only one
    ``OutputError`` naming the file."""
    image = io.BytesIO()
    figure.savefig(image, format=path.suffix[1:] or "png", **options)
    with refused_writes("the plot", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, image.getvalue())
    return path
