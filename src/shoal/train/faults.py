"""How a run stops when it cannot go on: a write the filesystem refuses, an update that diverged,
an env or worker that failed (how the restart options keep a run going within a budget is
``shoal.vector.restarts``). Each stop gives one message that says what went wrong, what was kept
(the newest checkpoint that loads) and how to continue, and no checkpoint of broken weights is
ever saved."""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml

from shoal.errors import EnvError, OutputError, TrainingDiverged, shorten
from shoal.files import refused_writes
from shoal.models.policy import Policy
from shoal.train import checkpoint as ckpt
from shoal.train import lineage

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer


def what_was_kept(run_dir: Path | None, then: str | None, overrides: str = "") -> str:
    """The newest checkpoint of the run that loads, and the command that continues from it (once
    the user has done ``then``, if anything)."""
    if run_dir is None:
        first = f"{then.lower()}, then start again" if then else "start again"
        return f"The run saves no outputs (save_outputs=False), so nothing was kept: {first}."
    for candidate in reversed(ckpt.list_checkpoints(run_dir / "checkpoints")):
        with contextlib.suppress(ckpt.CheckpointError, OSError):
            meta = ckpt.verify(candidate)
            at = f"iteration {meta['training_iteration']}, {meta['timesteps_total']} steps"
            kept = f"Kept: checkpoint '{candidate}' ({at})"
            resume = f"shoal train --resume {run_dir}{overrides}"
            return (
                f"{kept}, which loads. {then}, then continue with: {resume}"
                if then
                else f"{kept}, which loads. Continue with: {resume}"
            )
    folder = run_dir / "checkpoints"
    first = f"{then.lower()}, then start it again" if then else "start it again"
    return f"No checkpoint of this run was written yet ('{folder}'): {first}."


def interrupted(trainer: Trainer) -> str:
    """The message of a run stopped at once by a second Ctrl-C: where it was, and what was kept.
    The newest checkpoints beyond ``keep_checkpoints`` are pruned first, in case the interrupt
    came between a checkpoint and its pruning."""
    if trainer.run_dir is not None:
        lineage.rotate(trainer.run_dir / "checkpoints", trainer.config.keep_checkpoints, trainer.run_id)
    at = f"interrupted at iteration {trainer.iteration} ({trainer.timesteps_total} steps)"
    return f"{at}. {what_was_kept(trainer.run_dir, None)}"


def run_writes(
    what: str, path: Path | None, run_dir: Path | None, within: Path | None = None
) -> contextlib.AbstractContextManager[None]:
    """``files.refused_writes`` for a file of the run: the error also names the run's newest
    checkpoint that loads and the command that resumes it."""
    kept = None if run_dir is None else lambda: what_was_kept(run_dir, "Make room (or fix the permission)")
    return refused_writes(what, path or run_dir, within, kept)


def diverged(error: TrainingDiverged, trainer: Trainer, iteration: int) -> TrainingDiverged:
    """The run-level message for a non-finite value found during ``iteration``: what was kept, and
    the resume command with a tenth of the policy's step size."""
    c, pid = trainer.config, error.policy or ""
    lr = trainer.algorithm.policy_configs.get(pid, c).learning_rate
    own = c.policies.get(pid) if isinstance(c.policies, dict) else None
    tenth = float(f"{lr / 10:g}")
    if not (own and "learning_rate" in own):
        override = f"learning_rate={tenth:g}"
    elif "." in pid or "=" in pid:  # a dotted pair would split the id: give the policy's settings whole
        override = f"policies={yaml.safe_dump({pid: own | {'learning_rate': tenth}}, default_flow_style=True).strip()}"
    else:  # the policy's own step size, which a top-level key would not reach
        override = f"policies.{pid}.learning_rate={tenth:g}"
    override = " " + shlex.quote(override)
    policy = f"policy '{pid}'" if pid else "a policy"
    kept = what_was_kept(trainer.run_dir, f"Lower the step size (learning_rate is {lr:g})", override)
    return TrainingDiverged(
        f"training diverged at iteration {iteration} ({policy}): {error} Nothing after it was saved. {kept} "
        f"(max_grad_norm and observation or reward normalization help too).",
        error.policy,
    )


def save_learner(trainer: Trainer, error: EnvError) -> None:
    """Checkpoint the learner (weights, optimizer, normalizers, counters) as of the last whole
    iteration when an env failure stops the run, so a resume loses at most the fragment under way;
    ``error`` gets a last line saying where. The envs' state is not kept: the failed ones are in no
    state to save, and a resume starts new episodes. A checkpoint of that iteration already written
    (a periodic one, with the envs' state) is kept as it is."""
    run_dir, iteration = trainer.run_dir, trainer.iteration
    if run_dir is None:
        return
    root = run_dir / "checkpoints"
    path = root / f"{ckpt.PREFIX}{iteration:06d}"
    resume = f"continue with: shoal train --resume {run_dir}"
    if path in ckpt.list_checkpoints(root):
        error.add_line(f"The learner's state at iteration {iteration} is in '{path}'; {resume}")
        return
    if iteration == 0 or non_finite_weights(trainer.policies) is not None:
        return  # nothing learned yet, or nothing worth keeping
    try:
        state = trainer.state_dict()
    except Exception as e:  # (a Ray worker that cannot answer) the env's error stays the one raised
        error.add_line(f"The learner could not be checkpointed: gathering its state failed ({type(e).__name__}: {e}).")
        return
    failure = shorten(str(error).splitlines()[0] if str(error) else type(error).__name__, 160)
    state["backend"] = {"exact": False, "reason": f"the run stopped on: {failure}", "envs": [], "buffers": {}}
    try:
        with run_writes("the checkpoint", path, run_dir):
            ckpt.write_checkpoint(path, state, trainer.checkpoint_meta())
        lineage.rotate(root, trainer.config.keep_checkpoints, trainer.run_id)
    except OutputError as e:  # the env's error stays the one raised
        error.add_line(f"Checkpointing the learner failed too: {e}")
        return
    error.add_line(f"The learner's state at iteration {iteration} was checkpointed first; {resume}")


def non_finite_weights(policies: dict[str, Policy]) -> TrainingDiverged | None:
    """The first policy holding a non-finite parameter or buffer (e.g. normalizer statistics)."""
    for pid, policy in policies.items():
        tensors = {k: v for k, v in policy.state_dict().items() if v.is_floating_point()}
        if tensors and not bool(torch.stack([v.isfinite().all() for v in tensors.values()]).all()):
            name = next(k for k, v in tensors.items() if not bool(v.isfinite().all()))
            return TrainingDiverged(f"its weights hold non-finite values ('{name}').", pid)
    return None
