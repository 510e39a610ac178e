"""How a run stops when it cannot go on: a write the filesystem refuses, an update that diverged.
Either way it stops with one message that says what went wrong, what was kept (the newest
checkpoint that loads) and how to continue, and it never saves a checkpoint of broken weights."""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
import warnings
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import torch

from shoal.errors import EnvError, OutputError, TrainingDiverged
from shoal.models.policy import Policy
from shoal.train import checkpoint as ckpt

# What a filesystem answers when the run's files cannot be written: out of space or quota,
# read-only, no permission, file too large, a failing device.
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


def _free_space(path: Path) -> str:
    for folder in (path, *path.parents):  # the file itself may not exist
        if folder.is_dir():
            free = float(shutil.disk_usage(folder).free)
            for unit in ("bytes", "KB", "MB", "GB"):
                if free < 1024 or unit == "GB":
                    return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
                free /= 1024
    return "unknown space"


def what_was_kept(run_dir: Path | None, then: str, overrides: str = "") -> str:
    """The newest checkpoint of the run that loads, and the command that continues from it once
    the user has done ``then``."""
    if run_dir is None:
        return f"The run saves no outputs (save_outputs=False), so nothing was kept: {then.lower()}, then start again."
    for candidate in reversed(ckpt.list_checkpoints(run_dir / "checkpoints")):
        with contextlib.suppress(ckpt.CheckpointError, OSError):
            meta = ckpt.verify(candidate)
            return (
                f"Kept: checkpoint '{candidate}' (iteration {meta['training_iteration']}, "
                f"{meta['timesteps_total']} steps), which loads. {then}, then continue with: "
                f"shoal train --resume {run_dir}{overrides}"
            )
    folder = run_dir / "checkpoints"
    return f"No checkpoint of this run was written yet ('{folder}'): {then.lower()}, then start it again."


@contextlib.contextmanager
def run_writes(what: str, path: Path | None, run_dir: Path | None, within: Path | None = None) -> Iterator[None]:
    """Turn a refused write of ``what`` (at ``path``) into one ``OutputError``; with ``run_dir``
    it also names the run's newest checkpoint that loads and the command that resumes. With
    ``within``, only refusals of files under it count (an env's own file errors pass through)."""
    try:
        yield
    except OutputError:
        raise
    except Exception as e:
        refusal = refused_write(e)
        if refusal is None or (within is not None and not str(refusal.filename or "").startswith(str(within))):
            raise
        where = Path(refusal.filename) if refusal.filename else (path or run_dir or Path.cwd())
        kept = "" if run_dir is None else " " + what_was_kept(run_dir, "Make room (or fix the permission)")
        raise OutputError(
            f"could not write {what} '{where}': {refusal.strerror} ({_free_space(where)} free there now).{kept}"
        ) from e


def diverged(error: TrainingDiverged, iteration: int, run_dir: Path | None, lr: float) -> TrainingDiverged:
    """The run-level message for a non-finite value found during ``iteration``."""
    policy = f"policy '{error.policy}'" if error.policy else "a policy"
    kept = what_was_kept(run_dir, f"Lower the step size (learning_rate is {lr:g})", f" learning_rate={lr / 10:g}")
    return TrainingDiverged(
        f"training diverged at iteration {iteration} ({policy}): {error} Nothing after it was saved. {kept} "
        f"(max_grad_norm and observation or reward normalization help too).",
        error.policy,
    )


def non_finite_weights(policies: dict[str, Policy]) -> TrainingDiverged | None:
    """The first policy holding a non-finite parameter or buffer (e.g. normalizer statistics)."""
    for pid, policy in policies.items():
        tensors = {k: v for k, v in policy.state_dict().items() if v.is_floating_point()}
        if tensors and not bool(torch.stack([v.isfinite().all() for v in tensors.values()]).all()):
            name = next(k for k, v in tensors.items() if not bool(v.isfinite().all()))
            return TrainingDiverged(f"its weights hold non-finite values ('{name}').", pid)
    return None


class EnvRestarts:
    """Counts the envs (``restart_failed_envs``) and env worker processes (``recreate_failed_workers``)
    started anew after they failed, warns at each env's first failure and at each worker's death
    (the counts are in ``num_env_restarts`` / ``num_worker_restarts``), and stops the run when more
    than ``per_hour`` of them fall within an hour: a crash loop, not a flaky env."""

    def __init__(self, per_hour: int, env_name: str):
        self.per_hour, self.env_name = per_hour, env_name
        self.total = 0
        """Envs made anew."""
        self.workers = 0
        """Worker processes started anew."""
        self._times: deque[float] = deque(maxlen=per_hour + 1)
        self._warned: set[int] = set()

    def take(self, envs: list[tuple[int, str]], workers: list[str]) -> None:
        """Count ``envs`` ((env id, error) pairs) and ``workers`` (why each died); both are emptied."""
        now = time.monotonic()
        for env_id, error in envs:
            if env_id not in self._warned:
                self._warned.add(env_id)
                warnings.warn(
                    f"env '{self.env_name}' (env {env_id}) failed ({error}) and was made anew; its later failures "
                    f"are counted in num_env_restarts.",
                    stacklevel=3,
                )
        for why in workers:
            warnings.warn(f"{why}; it was started anew with fresh envs (recreate_failed_workers).", stacklevel=3)
        self.total += len(envs)
        self.workers += len(workers)
        self._times.extend([now] * (len(envs) + len(workers)))
        last = f"env {envs[-1][0]}: {envs[-1][1]}" if envs else workers[-1]
        envs.clear()
        workers.clear()
        if len(self._times) > self.per_hour and now - self._times[0] < 3600:
            raise EnvError(
                f"{len(self._times)} envs or workers of '{self.env_name}' failed within the last hour, more than "
                f"max_restarts_per_hour={self.per_hour}: they keep failing (the last: {last}). Fix the env, or "
                f"raise max_restarts_per_hour if it is only flaky."
            )
