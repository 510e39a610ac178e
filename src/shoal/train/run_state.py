"""A trainer's whole state, as its checkpoints hold it: what ``Trainer.state_dict`` gathers (the
counters, the algorithm, the collector, the envs where they can be saved, the random generators),
how ``load_state_dict`` puts it back so the run continues bit for bit, and what
``Trainer.from_checkpoint`` rebuilds a trainer from; and the summary of where a run ended
(``result.json``)."""

from __future__ import annotations

import functools
import json
import random
import subprocess
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from shoal.algos.base import Algorithm
from shoal.algos.registry import algorithm_class, algorithm_spec
from shoal.config import merge_settings
from shoal.envs.snapshot import decode, encode
from shoal.errors import ConfigError, shorten, warn
from shoal.files import write_atomic
from shoal.logging import MetricAnalysis
from shoal.train import checkpoint as ckpt
from shoal.train import data_parallel, faults, lineage

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer


def gather(trainer: Trainer) -> dict[str, Any]:
    """``Trainer.state_dict``: everything a resumed run needs, as tensors and plain data."""
    t = trainer
    return {
        "config": t.config.to_yaml_dict(),
        "counters": {
            "iteration": t.iteration,
            "timesteps_total": t.timesteps_total,
            "time_total_s": t.time_total_s,
            "schedule_end": t._schedule_end,
            "env_restarts": t.env_restarts.total,
            "worker_restarts": t.env_restarts.workers,
        },
        "algorithm": t.algorithm.state_dict(),
        "collector": t.collector.state_dict(),
        "analysis": t.analysis.stats,
        "backend": t.backend.state_dict(),
        "rng": {
            "python": random.getstate(),
            "numpy": encode(np.random.get_state()),
            "torch": torch.get_rng_state(),
        },
    }


def restore(trainer: Trainer, state: dict[str, Any]) -> None:
    """``Trainer.load_state_dict``: put back what ``gather`` returned."""
    t = trainer
    try:
        t.algorithm.load_state_dict(state["algorithm"])
        t.collector.load_state_dict(state["collector"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ckpt.CheckpointError(f"the checkpoint does not fit this trainer's config: {e}") from None
    counters = state["counters"]
    t.iteration, t.timesteps_total = counters["iteration"], counters["timesteps_total"]
    t.time_total_s, t._schedule_end = counters["time_total_s"], counters["schedule_end"]
    # checkpoints written before restarts were counted have neither
    t.env_restarts.total = counters.get("env_restarts", 0)
    t.env_restarts.workers = counters.get("worker_restarts", 0)
    t.analysis = MetricAnalysis(state["analysis"])
    steps_envs = t.config.input == "sampler"  # a run reading datasets has no episodes under way in its envs
    if steps_envs and not t.backend.load_state_dict(state["backend"]):
        warn(
            f"env '{t.env_name}': the episodes under way were not saved ({state['backend']['reason']}); "
            f"the resumed run starts new episodes instead of continuing them."
        )
        t.collector.reset(t.config.seed + t.iteration)  # the tracker forgets the episodes too
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(decode(rng["numpy"]))
    torch.set_rng_state(rng["torch"])
    data_parallel.after_resume(t)


@functools.cache
def source_revision() -> str | None:
    """The git commit of the source shoal runs from, ``+changes`` when its files differ from it;
    None when shoal is not run from a git checkout (an installed wheel). A run made in parts
    records each part's, so that a figure can say which code made it."""
    package = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no", "--", ".") else "")


def meta(trainer: Trainer) -> dict[str, Any]:
    """What a checkpoint records beside the state: algorithm, env, counters, shoal version, time,
    and what ties it to its run (``shoal.train.lineage``): the run id and config fingerprint."""
    from shoal import __version__

    return {
        "algo": algorithm_spec(trainer.algorithm_class),
        "run_id": trainer.run_id,
        "fingerprint": lineage.fingerprint(trainer.config.to_yaml_dict()),
        "tuned_config": str(trainer.tuned_config) if trainer.tuned_config else None,
        "env": trainer.env_name,
        "env_is_object": trainer.config.env_is_object,
        "training_iteration": trainer.iteration,
        "timesteps_total": trainer.timesteps_total,
        "shoal_version": __version__,
        "source": source_revision(),
        "saved_at": datetime.now().isoformat(timespec="seconds"),
    }


def saved_run(
    path: str | Path, preset: str | type[Algorithm] | None, overrides: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``Trainer.from_checkpoint``: the settings to build the trainer with (the stored config under
    ``overrides``), the state to load into it and the checkpoint's meta, from the checkpoint
    ``path`` names, once it is found to belong to the run it is loaded into. ``preset``: the one
    algorithm the trainer class trains (``shoal.PPO``'s), which the checkpoint must be of."""
    path = ckpt.resolve_checkpoint(path)
    state, checkpoint_meta = ckpt.read_checkpoint(path)
    settings = dict(state["config"])
    into = overrides.get("run_dir")
    lineage.check_checkpoint(path, checkpoint_meta, settings, None if into is None else Path(into))
    if preset is not None and "algo" not in overrides:
        saved = settings["algo"]
        try:
            same = algorithm_class(saved) is algorithm_class(preset)
        except ConfigError:  # an algorithm of the user's that does not import here
            same = False
        if not same:
            raise ckpt.CheckpointError(
                f"checkpoint '{path}' was written by algo '{saved}', not '{preset}'; load "
                f"it with shoal.Trainer.from_checkpoint."
            )
    merged = merge_settings(ckpt.stored_settings(path, settings, checkpoint_meta, overrides), overrides)
    _keeps_identity(path, settings, merged)
    return merged, state, checkpoint_meta


def _keeps_identity(path: Path, stored: dict[str, Any], merged: dict[str, Any]) -> None:
    """Refuse settings that change what the checkpoint's networks were built for (the keys of its
    config fingerprint): its state could not be loaded into them."""
    # an env object passed again stands for the stored one, and an env given to a run that had none
    # for its datasets' spaces (the datasets are checked against it as the run starts)
    if not isinstance(merged.get("env"), str) or stored.get("env") is None:
        merged = {**merged, "env": stored.get("env")}
    if lineage.fingerprint(merged) == lineage.fingerprint(stored):
        return
    keys = [k for k in ("algo", *lineage.IDENTITY_KEYS, "policies") if merged.get(k) != stored.get(k)]
    changes = "; ".join(f"{k}: {shorten(str(stored.get(k)), 80)} -> {shorten(str(merged.get(k)), 80)}" for k in keys)
    raise ckpt.CheckpointError(
        f"the settings given change what checkpoint '{path}' was trained as ({changes}); a resume keeps "
        f"the algorithm, env, model and policies. Start a new run to change them."
    )


def continue_run(trainer: Trainer, path: Path, meta: dict[str, Any], new_budget: bool) -> None:
    """After ``restore``: what a resumed run keeps of the run it continues. Its logs go on after
    the checkpoint; its budget is the one it was given (its last ``learn``'s) unless ``new_budget``;
    the tuned config it started from; and its run id when it writes to that run's directory."""
    t = trainer
    t._resume_point = (t.iteration, t.timesteps_total)
    if not new_budget:
        t.config.total_timesteps = max(1, t._schedule_end)
    if meta.get("tuned_config"):
        t.tuned_config = Path(meta["tuned_config"])
    if t.run_dir is not None:
        own = lineage.read_identity(t.run_dir) or {}
        same_run = t.run_dir.resolve() == (lineage.run_dir_of(path) or path).resolve()
        t.run_id = own.get("run_id") or (meta.get("run_id") if same_run else None) or t.run_id


def stop_reason(trainer: Trainer) -> str:
    """Why the run's last ``learn`` ended, as result.json and ``shoal train`` report it."""
    return trainer.stop_reason or "total_timesteps"  # None on the trainer: it ran to its budget


def write_summary(trainer: Trainer, checkpoint: Path | None) -> None:
    """``result.json`` in the run directory: the counters, why the run stopped, its last checkpoint,
    the tuned config it started from and the metrics' summary."""
    t = trainer
    assert t.run_dir is not None  # written only for runs that save outputs
    summary = {
        "training_iteration": t.iteration,
        "timesteps_total": t.timesteps_total,
        "time_total_s": t.time_total_s,
        "stop_reason": stop_reason(t),
        "checkpoint": str(checkpoint) if checkpoint else None,
        "tuned_config": str(t.tuned_config) if t.tuned_config else None,
        "metric_analysis": t.analysis.summary(),
    }
    path = t.run_dir / "result.json"
    with faults.run_writes("the run's summary", path, t.run_dir):
        write_atomic(path, json.dumps(summary, indent=2))
