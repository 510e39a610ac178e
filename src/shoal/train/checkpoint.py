"""Checkpoint files: written atomically, verified before they are read, never unpickling code.

A checkpoint is a directory holding ``state.pt`` (a torch.save of tensors and plain data,
read back with ``weights_only=True``) and ``meta.json`` (counters, algorithm and the SHA-256 of
``state.pt``). It is built under a temporary name and renamed into place, so a process killed at
any moment leaves either the whole checkpoint or none of it; ``meta.json`` is written last, so a
directory without it (or whose checksum does not match) is never taken for a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from shoal.errors import ShoalError, warn
from shoal.imports import importable, is_spec

FORMAT_VERSION = 2
STATE_FILE, META_FILE = "state.pt", "meta.json"
PREFIX, TMP_PREFIX = "checkpoint_", ".tmp-"


class CheckpointError(ShoalError):
    """A checkpoint is missing, truncated, modified or holds something other than plain data."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(target: Path, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` and ``meta`` to the directory ``target``, replacing it atomically."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f"{TMP_PREFIX}{target.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_into(tmp, target, state, meta)
    except BaseException:  # a full disk, a second Ctrl-C: the partial copy goes, the previous ones stay
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
    return target


def _write_into(tmp: Path, target: Path, state: dict[str, Any], meta: dict[str, Any]) -> None:
    with (tmp / STATE_FILE).open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    meta = {**meta, "format": FORMAT_VERSION, "sha256": _sha256(tmp / STATE_FILE)}
    with (tmp / META_FILE).open("w") as f:
        json.dump(meta, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    if target.exists():  # re-saving the same iteration: move the old one aside, then drop it
        old = target.parent / f"{TMP_PREFIX}old-{target.name}-{os.getpid()}"
        target.rename(old)
        try:
            tmp.rename(target)
        except BaseException:
            old.rename(target)
            raise
        shutil.rmtree(old)
    else:
        tmp.rename(target)


def read_meta(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"'{path}' is not a checkpoint: it has no {META_FILE} (an unfinished write?).") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint '{path}' has an unreadable {META_FILE} ({e}).") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint '{path}' has format {meta.get('format') if isinstance(meta, dict) else '?'}; "
            f"this shoal reads format {FORMAT_VERSION}."
        )
    return meta


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's meta, once ``state.pt`` is found whole (its SHA-256 matches)."""
    path = Path(path)
    meta = read_meta(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint '{path}' has no {STATE_FILE}.")
    if _sha256(state_file) != meta.get("sha256"):
        raise CheckpointError(
            f"checkpoint '{path}': {STATE_FILE} does not match the checksum in {META_FILE}; "
            f"the file is truncated or was modified. Use an earlier checkpoint."
        )
    return meta


def read_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify and load a checkpoint directory; returns ``(state, meta)``."""
    path = Path(path)
    meta = verify(path)
    state_file = path / STATE_FILE
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"refusing to load checkpoint '{path}': {STATE_FILE} holds objects other than tensors "
            f"and plain data, which could run code when unpickled ({first_line})."
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"checkpoint '{path}': {STATE_FILE} cannot be read ({e}).") from None
    return state, meta


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint directories under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / META_FILE).is_file())


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint, a checkpoints folder or a run directory.

    For a folder of checkpoints the newest one that verifies is taken; damaged newer ones are
    skipped with a warning, so a run killed mid-write resumes from the last good state.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"'{path}' does not exist.")
    if (path / META_FILE).is_file() or (path / STATE_FILE).is_file():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    candidates = list_checkpoints(root)
    for candidate in reversed(candidates):
        try:
            verify(candidate)
            return candidate
        except (CheckpointError, OSError) as e:
            warn(f"skipping damaged checkpoint: {e}")
    raise CheckpointError(f"no usable checkpoint in '{path}' (looked for {PREFIX}* directories in '{root}').")


def stored_settings(
    path: Path, settings: dict[str, Any], meta: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """The config a checkpoint was trained with, ready to build its trainer again. Objects are not
    stored (only their repr): importable ones are kept, and the others must be passed again in
    ``overrides``, which this says by name."""
    if meta.get("env_is_object") and "env" not in overrides:
        raise CheckpointError(
            f"checkpoint '{path}' was trained on an env object ({settings['env']}); "
            f"pass the same env again: from_checkpoint(path, env=...)."
        )
    settings = dict(settings, callbacks=[cb for cb in settings.get("callbacks", []) if is_spec(cb)])
    for key in ("policy_mapping_fn", "algo", "model"):
        value = settings.get(key)
        stored_object = isinstance(value, str) and (key == "policy_mapping_fn" or ":" in value)
        if stored_object and not importable(value) and key not in overrides:
            raise CheckpointError(
                f"checkpoint '{path}' was trained with {key} {value}, which cannot be "
                f"imported; pass it again: from_checkpoint(path, {key}=...)."
            )
    settings.setdefault("tuned", False)  # written before tuned configs: every key is in it
    return settings
