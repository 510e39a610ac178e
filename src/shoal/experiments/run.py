"""Running experiments: on Ray Tune (trials at once, as resources allow; Tune's checkpoints and
restore), or one trial after another in this process. Either way each trial is a shoal run
directory, ``OUT/<experiment>/<trial>/``, with ``trial.json`` naming its searched values, and
running the same command again resumes: finished trials are kept, unfinished ones continue from
their newest checkpoint.

    OUT/<experiment>/<trial>/   the trial's run: config.yaml, metrics.jsonl, checkpoints/, result.json, trial.json
    OUT/tune/<experiment>/      Tune's state of the sweep (what a restore reads)
    OUT/results.md, OUT/<experiment>.png   the table and the comparison plot (experiments.report)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.errors import ConfigError
from shoal.experiments.spec import Experiment, Space, Trial, param_name, trials
from shoal.train import checkpoint as ckpt
from shoal.train.callbacks import Callback
from shoal.train.trainer import Trainer

INTERRUPTED = ("SIGINT", "SIGTERM")
Report = Callable[[dict[str, Any], Path | None], None]  # (result, checkpoint written this iteration)


def stop_reached(result: dict[str, Any], stop: dict[str, float]) -> bool:
    """Whether any criterion is met: the result's value at or above the criterion's."""
    return any(result.get(key) is not None and result[key] >= value for key, value in stop.items())


class TrialCallback(Callback):
    """Ends a trial at its stop criteria, checkpoints it every ``checkpoint_freq`` iterations and
    at its end, and hands each result (and checkpoint) to ``report`` (Tune's, under Tune)."""

    def __init__(self, stop: dict[str, float], checkpoint_freq: int, report: Report | None = None):
        self.stop, self.checkpoint_freq, self.report = stop, checkpoint_freq, report

    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> bool:
        done = stop_reached(result, self.stop)
        due = bool(self.checkpoint_freq) and trainer.iteration % self.checkpoint_freq == 0
        path = trainer.save() if done or due else None
        if self.report is not None:
            self.report(result, path)
        return done


def run_trial(
    trial: Trial,
    experiment: Experiment,
    run_dir: Path,
    verbose: int,
    report: Report | None = None,
    start: Path | None = None,
) -> str | None:
    """Train ``trial`` in ``run_dir`` until a stop criterion is met (or the config's
    ``total_timesteps``), resuming from ``start`` or from the run's newest checkpoint; returns the
    trainer's stop reason (None: it ran to its budget)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trial.json").write_text(
        json.dumps({"experiment": trial.experiment, "params": trial.params}, default=str)
    )
    callbacks = [
        *trial.settings.get("callbacks", []),
        TrialCallback(experiment.stop, experiment.checkpoint_freq, report),
    ]
    settings = trial.settings | {"run_dir": str(run_dir), "verbose": verbose, "checkpoint_interval": 0}
    if start is None and (run_dir / "checkpoints").is_dir():
        start = run_dir
    if start is not None:
        try:
            trainer = Trainer.from_checkpoint(start, callbacks=callbacks, verbose=verbose, **_objects(settings))
        except ckpt.CheckpointError as e:
            print(f"shoal: trial {trial.name} starts over: {e}", file=sys.stderr)
            start = None
    if start is None:
        trainer = Trainer(**settings | {"callbacks": callbacks})
    with trainer:
        budget = int(experiment.stop.get("timesteps_total", trainer.config.total_timesteps))
        # at least one iteration, so a trial resumed at its budget still writes its result.json
        trainer.learn(max(budget - trainer.timesteps_total, 1))
        return trainer.stop_reason


def _objects(settings: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint cannot hold and a resume needs again: an env given as an object."""
    return {} if isinstance(settings["env"], str) else {"env": settings["env"]}


def finished(run_dir: Path) -> bool:
    """A trial ran to its end: ``result.json`` written by a run that was not interrupted."""
    path = run_dir / "result.json"
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("stop_reason") not in INTERRUPTED


def run_sequential(experiments: list[Experiment], out: Path, verbose: int = 1) -> bool:
    """Every trial in turn, in this process; False when one was interrupted (Ctrl-C, SIGTERM)."""
    for experiment in experiments:
        planned = trials(experiment)
        for index, trial in enumerate(planned, start=1):
            run_dir = out / experiment.name / trial.name
            if finished(run_dir):
                continue
            if verbose:
                params = ", ".join(f"{k}={v}" for k, v in trial.params.items())
                print(f"shoal: {experiment.name} trial {index}/{len(planned)}: {params}", file=sys.stderr)
            if run_trial(trial, experiment, run_dir, verbose) in INTERRUPTED:
                return False
    return True


# ----- Ray Tune --------------------------------------------------------------------------------
def tune_module() -> Any:
    try:
        from ray import tune
    except ImportError:
        raise ConfigError(
            "`shoal tune` on Ray Tune needs it: pip install 'shoal[ray]' (or pass --sequential)."
        ) from None
    return tune


def run_on_tune(
    experiments: list[Experiment], out: Path, concurrent: int | None = None, address: str | None = None
) -> bool:
    """Each experiment as one Tune run (its trials at once, as the cluster's CPUs allow, or
    ``concurrent``); an experiment Tune already has state of is restored, its unfinished trials
    continuing from their last checkpoints. False when a trial did not finish."""
    import ray

    tune = tune_module()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)
    complete = True
    for experiment in experiments:
        state = out / "tune" / experiment.name
        trainable = tune.with_resources(
            tune.with_parameters(_tune_trial, experiment=experiment, out=str(out.resolve())),
            {"cpu": experiment.cpus_per_trial},
        )
        if tune.Tuner.can_restore(str(state.resolve())):
            tuner = tune.Tuner.restore(str(state.resolve()), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=_param_space(tune, experiment),
                tune_config=tune.TuneConfig(
                    num_samples=experiment.num_samples,
                    max_concurrent_trials=concurrent,
                    reuse_actors=True,
                    trial_name_creator=_trial_name,
                    trial_dirname_creator=_trial_name,
                ),
                run_config=tune.RunConfig(
                    name=experiment.name,
                    storage_path=str((out / "tune").resolve()),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    verbose=1,
                ),
            )
        grid = tuner.fit()
        complete = (
            complete
            and not grid.errors
            and all(finished(out / experiment.name / Path(result.path).name) for result in grid)
        )
    return complete


def _param_space(tune: Any, experiment: Experiment) -> dict[str, Any]:
    def convert(node: Any) -> Any:
        if isinstance(node, Space):
            if node.kind in ("grid_search", "choice"):
                return getattr(tune, node.kind)(node.values)
            return getattr(tune, node.kind)(*node.values)
        if isinstance(node, dict):
            return {k: convert(v) for k, v in node.items()}
        return node

    space: dict[str, Any] = convert(experiment.settings)
    return space | {"seed": tune.grid_search(experiment.seeds)}


def _trial_name(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _tune_trial(settings: dict[str, Any], experiment: Experiment, out: str) -> None:
    """One Tune trial: a shoal run reporting each iteration to Tune, with its checkpoints."""
    from ray import tune

    context = tune.get_context()
    name = context.get_trial_name()
    params = {param_name(path): _at(settings, path) for path, _ in experiment.spaces} | {"seed": settings["seed"]}
    trial = Trial(experiment.name, name, params, settings)

    def report(result: dict[str, Any], path: Path | None) -> None:
        metrics = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}
        tune.report(metrics, checkpoint=None if path is None else tune.Checkpoint.from_directory(str(path)))

    checkpoint = tune.get_checkpoint()
    start = None if checkpoint is None else Path(checkpoint.path)
    run_trial(trial, experiment, Path(out) / experiment.name / name, verbose=0, report=report, start=start)


def _at(settings: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = settings
    for key in path:
        node = node[key]
    return node
