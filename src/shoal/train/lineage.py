"""Which run a checkpoint belongs to, so that a checkpoint of another run (copied in, or left in a
reused directory) is never evaluated, resumed or pruned as this run's.

A run directory holds ``run.json``, written when the run first writes there: a random run id, the
algorithm and the config fingerprint (a hash of what fixes the networks' shapes: the algorithm,
the env, the model and the policy ids; what a resume may change, such as a step size or the
budget, is left out). Every checkpoint's ``meta.json`` records the same three. A load compares
the checkpoint's meta with its own state, and with the run it is loaded into or lives in; any
difference stops with one message naming both sides. Checkpoints written before run ids existed
carry none: for them, and for runs without ``run.json``, the algorithm and fingerprint are
compared (the run's from its ``config.yaml``).

Pruning keeps the newest ``keep_checkpoints`` of this run's own checkpoints and nothing else.
Checkpoints a run must not overwrite or prune are moved aside, into a folder of ``checkpoints/``
that loads and pruning do not look in: a resumed run's later ones (the branch it left), those of
an earlier run when a new run starts in its directory, and another run's in the way of a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from shoal.algos.registry import algorithm_class, algorithm_spec
from shoal.errors import ConfigError, warn
from shoal.files import write_atomic
from shoal.imports import spec_of
from shoal.train import checkpoint as ckpt
from shoal.yaml_io import load_yaml

RUN_FILE = "run.json"
IDENTITY_KEYS = ("env", "model", "model_config")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in the repr of an env object or function: new in every process


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def algo_of(config: dict[str, Any]) -> str:
    """The algorithm a stored config names, as checkpoints record it ('ppo', 'pkg.mod:Class')."""
    return algorithm_spec(algorithm_class(config.get("algo", "ppo")))


def fingerprint(config: dict[str, Any]) -> str:
    """A hash of the config's keys that fix the shape of the state: the algorithm, the env, the
    model and its settings, and the policy ids. Objects count as config.yaml stores them (a class
    as 'module:Class', anything else by its repr without memory addresses), so that the same run
    has the same fingerprint in every process."""
    identity = {key: config.get(key) for key in IDENTITY_KEYS}
    policies = config.get("policies")
    identity["policies"] = sorted(map(str, policies)) if isinstance(policies, (dict, list)) else policies
    identity["algo"] = algo_of(config)
    if isinstance(identity["model"], type):
        identity["model"] = spec_of(identity["model"])
    text = _ADDRESS.sub("", json.dumps(identity, sort_keys=True, default=repr))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_dir_of(path: Path) -> Path | None:
    """The run directory a checkpoint (``<run>/checkpoints/checkpoint_N``) or a checkpoints folder
    lives in, if it does."""
    path = Path(path)
    if path.name == "checkpoints":
        return path.parent
    return path.parent.parent if path.parent.name == "checkpoints" else None


def read_identity(run_dir: Path) -> dict[str, Any] | None:
    """The run's identity: its ``run.json``, else (a run written before run ids) the algorithm and
    fingerprint of its ``config.yaml``; None for a directory that holds no run yet."""
    run_dir = Path(run_dir)
    with_ids, config_file = run_dir / RUN_FILE, run_dir / "config.yaml"
    try:
        if with_ids.is_file():
            identity = json.loads(with_ids.read_text())
            if isinstance(identity, dict):
                return identity
        if config_file.is_file():
            config = load_yaml(config_file)
            return {"algo": algo_of(config), "fingerprint": fingerprint(config), "env": config.get("env")}
    except (OSError, ValueError):  # unreadable (ConfigError is a ValueError): nothing to compare with
        pass
    return None


def claim(run_dir: Path, run_id: str, config: dict[str, Any], env: str, resumed_at: int | None) -> None:
    """Make ``run_dir`` this run's as it first writes there. A new run (``resumed_at`` None) in a
    directory of an earlier run sets that run's checkpoints aside and writes its own ``run.json``; a
    resumed run keeps the directory's and sets aside its own checkpoints after ``resumed_at``."""
    root = Path(run_dir) / "checkpoints"
    known = read_identity(run_dir)
    if resumed_at is not None:
        later = [path for path, meta in own_checkpoints(root, run_id, known) if meta["training_iteration"] > resumed_at]
        _set_aside(root, later, "superseded", f"the run resumed from iteration {resumed_at}, before them")
    elif known is not None and known.get("run_id") != run_id:
        _set_aside(root, ckpt.list_checkpoints(root), "earlier-run", "a new run started in this directory")
    if resumed_at is None or not (Path(run_dir) / RUN_FILE).is_file():
        identity = {
            "run_id": run_id,
            "algo": algo_of(config),
            "fingerprint": fingerprint(config),
            "env": env,
            "created": datetime.now().isoformat(timespec="seconds"),
        }
        write_atomic(Path(run_dir) / RUN_FILE, json.dumps(identity, indent=2))


def _describe(run_id: str | None, algo: str, env: Any) -> str:
    return f"{'run ' + run_id if run_id else 'a run without an id'} ({algo} on {env})"


def check_checkpoint(path: Path, meta: dict[str, Any], config: dict[str, Any], run_dir: Path | None) -> None:
    """Refuse a checkpoint whose meta disagrees with its own state, or which belongs to another run
    than ``run_dir``'s (None: the run it lives in, if any)."""
    try:
        algo = algo_of(config)
    except ConfigError as e:
        raise ckpt.CheckpointError(f"checkpoint '{path}' cannot be loaded here: {e}") from None
    print_ = fingerprint(config)
    if meta.get("algo") != algo or meta.get("fingerprint", print_) != print_:
        raise ckpt.CheckpointError(
            f"checkpoint '{path}' contradicts itself: its {ckpt.META_FILE} says algo '{meta.get('algo')}' "
            f"(fingerprint {meta.get('fingerprint', 'none')}), and its {ckpt.STATE_FILE} was written by algo "
            f"'{algo}' (fingerprint {print_}); one of the files was edited or they come from two checkpoints."
        )
    run_dir = run_dir if run_dir is not None else run_dir_of(path)
    run = read_identity(run_dir) if run_dir is not None else None
    if run is None:
        return
    differ = [
        what
        for what, mine, theirs in (
            ("run id", meta.get("run_id"), run.get("run_id")),
            ("algorithm", algo, run.get("algo")),
            ("config fingerprint", print_, run.get("fingerprint")),
        )
        if mine is not None and theirs is not None and mine != theirs
    ]
    if differ:
        raise ckpt.CheckpointError(
            f"checkpoint '{path}' is not a checkpoint of the run in '{run_dir}': it was written by "
            f"{_describe(meta.get('run_id'), algo, meta.get('env'))}, and '{run_dir}' holds "
            f"{_describe(run.get('run_id'), str(run.get('algo')), run.get('env'))}; they differ in "
            f"{', '.join(differ)}. Move the checkpoint out of '{run_dir}' to load it on its own."
        )


def own_checkpoints(root: Path, run_id: str, identity: dict[str, Any] | None) -> list[tuple[Path, dict[str, Any]]]:
    """This run's checkpoints under ``root`` with their meta, oldest first: those recording its run
    id, and those written before run ids whose algorithm and env are the run's (``identity``)."""
    own = []
    for path in ckpt.list_checkpoints(root):
        try:
            meta = ckpt.read_meta(path)
        except (ckpt.CheckpointError, OSError):
            continue  # a damaged one is left for resolve_checkpoint to skip and name
        if meta.get("run_id") is None and identity is not None:
            if (meta.get("algo"), meta.get("env")) == (identity.get("algo"), identity.get("env")):
                own.append((path, meta))
        elif meta.get("run_id") == run_id:
            own.append((path, meta))
    return own


def rotate(root: Path, keep: int, run_id: str) -> None:
    """Delete all but the newest ``keep`` of this run's checkpoints (another run's are never
    touched), and the temporary leftovers of killed writes."""
    identity = read_identity(Path(root).parent)
    for path, _ in own_checkpoints(root, run_id, identity)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    for tmp in Path(root).glob(f"{ckpt.TMP_PREFIX}*"):
        if not tmp.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(tmp, ignore_errors=True)


def make_way(target: Path, run_id: str) -> None:
    """Before this run writes the checkpoint ``target``: a checkpoint of another run in its place
    is set aside rather than replaced."""
    if not target.is_dir():
        return
    try:
        other = ckpt.read_meta(target).get("run_id")
    except (ckpt.CheckpointError, OSError):
        return  # not a whole checkpoint: the write replaces it as before
    if other is not None and other != run_id:
        _set_aside(target.parent, [target], "other-run", f"run {other} wrote it, and run {run_id} writes there now")


def _set_aside(root: Path, paths: list[Path], kind: str, why: str) -> None:
    """Move ``paths`` into a new folder ``<kind>-<time>`` of ``root``, saying so."""
    if not paths:
        return
    stamp = f"{kind}-{datetime.now():%Y%m%d-%H%M%S}"
    folder = root / stamp
    for n in range(2, 1000):  # two set-asides within a second get folders of their own
        if not folder.exists():
            break
        folder = root / f"{stamp}-{n}"
    folder.mkdir()
    for path in paths:
        path.rename(folder / path.name)
    names = paths[0].name if len(paths) == 1 else f"{len(paths)} checkpoints, {paths[0].name} to {paths[-1].name}"
    warn(f"{why}; {names} moved to '{folder}', where they are neither loaded nor pruned.")
