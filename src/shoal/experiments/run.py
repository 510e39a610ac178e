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

import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from shoal.errors import ConfigError
from shoal.experiments.books import Reading, locked_json
from shoal.experiments.population import BOOK, Exploit, PopulationBook, take_learned_state
from shoal.experiments.spec import Experiment, Halving, Trial, param_name, trials, with_values
from shoal.files import write_atomic
from shoal.train import checkpoint as ckpt
from shoal.train.callbacks import Callback
from shoal.train.trainer import Trainer

INTERRUPTED = ("SIGINT", "SIGTERM")
RUNGS = "asha_rungs.json"  # in OUT/<experiment>/: what each trial had at each rung
Report = Callable[[dict[str, Any], Path | None], None]  # (result, checkpoint written this iteration)
Outcome = Literal["done", "incomplete", "interrupted"]  # of an experiment's trials: all finished, some not, Ctrl-C


class Pruner(Protocol):
    """What stops weak trials early: successive halving's ``RungBook``, Optuna's median rule."""

    time_attr: str

    def pruned_at(self, trial: str, result: dict[str, Any]) -> float | None:
        """Where (in ``time_attr``) ``trial`` stops with this result; None: it goes on."""
        ...

    def why(self) -> str:
        """Why a trial stopped, for the console."""
        ...


def stop_reached(result: dict[str, Any], stop: dict[str, float]) -> bool:
    """Whether any criterion is met: the result's value at or above the criterion's."""
    return any(result.get(key) is not None and result[key] >= value for key, value in stop.items())


class RungBook:
    """What the trials of one experiment had at each rung of its successive halving, and which it
    stopped where, in one JSON file beside them (``OUT/<experiment>/asha_rungs.json``), read and
    written under a file lock, so that trials running at once on this machine (on Tune) judge each
    other, and a stopped trial resumed after an interrupt stops again."""

    def __init__(self, halving: Halving, path: Path):
        self.halving, self.path = halving, path
        self.time_attr = halving.time_attr
        self.reading = Reading("scheduler", halving.metric, halving.time_attr)

    def why(self) -> str:
        h = self.halving
        return f"its {h.metric} was below the best 1/{h.reduction_factor:g} of the trials there before it"

    def pruned_at(self, trial: str, result: dict[str, Any]) -> float | None:
        """The rung at which ``trial`` stops with this result (None: it goes on). As Tune's ASHA,
        a result is judged at the highest rung it has passed and not been judged at; one without
        the metric yet (no episode ended) is judged at its next result that has it."""
        h = self.halving
        if (reading := self.reading(result)) is None:
            return None
        progress, value = reading
        score = value if h.mode == "max" else -value
        with locked_json(self.path, {"rungs": {}, "pruned": {}}) as book:
            stopped: float | None = book["pruned"].get(trial)
            if stopped is not None:
                return stopped
            rungs = h.rungs_passed(progress)
            seen = book["rungs"].setdefault(str(len(rungs) - 1), {}) if rungs else {}  # keyed by index k
            if not rungs or trial in seen:
                return None
            before = list(seen.values())
            seen[trial] = score
            if before and score < float(np.percentile(before, 100 * (1 - 1 / h.reduction_factor))):
                book["pruned"][trial] = rungs[-1]
                return rungs[-1]
        return None


class TrialCallback(Callback):
    """Ends a trial at its stop criteria, or where its experiment's successive halving prunes it,
    or where population-based training has it exploit another trial (``exploit``, for
    ``run_trial`` to carry out); checkpoints it every ``checkpoint_freq`` iterations and at its
    end; and hands each result (and checkpoint) to ``report`` (Tune's, under Tune)."""

    def __init__(
        self,
        stop: dict[str, float],
        checkpoint_freq: int,
        report: Report | None = None,
        prune: Callable[[dict[str, Any]], float | None] | None = None,
        population: Callable[[Trainer, dict[str, Any]], Exploit | None] | None = None,
    ):
        self.stop, self.checkpoint_freq, self.report, self.prune = stop, checkpoint_freq, report, prune
        self.population = population
        self.pruned_at: float | None = None
        self.exploit: Exploit | None = None

    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> bool:
        done = stop_reached(result, self.stop)  # then learn() ends and writes the last checkpoint itself
        if not done and self.prune is not None and self.pruned_at is None:  # a trial at its stop is not pruned
            self.pruned_at = self.prune(result)
        if not done and self.population is not None:
            self.exploit = self.population(trainer, result)
        done = done or self.pruned_at is not None or self.exploit is not None
        due = bool(self.checkpoint_freq) and trainer.iteration % self.checkpoint_freq == 0
        path = trainer.save() if due and not done else None
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
    pruner: Pruner | None = None,
) -> str | None:
    """Train ``trial`` in ``run_dir`` until a stop criterion is met (or the config's
    ``total_timesteps``) or ``pruner`` (default: the experiment's successive halving, if any) stops
    it, resuming from ``start`` or from the run's newest checkpoint; under population-based
    training, going on from other trials' state where it falls behind. Returns the trainer's stop
    reason (None: it ran to its budget)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    held = _update_trial_json(run_dir, {"experiment": trial.experiment, "params": trial.params})
    if pruner is None and experiment.halving is not None:
        pruner = RungBook(experiment.halving, run_dir.parent / RUNGS)
    prune = None if pruner is None else functools.partial(pruner.pruned_at, trial.name)
    book = None
    if experiment.population is not None:
        members = [t.name for t in trials(experiment)]
        book = PopulationBook(experiment.population, experiment.spaces, run_dir.parent / BOOK, trial.name, members)
    exploit = None if book is None else book.at_point
    control = TrialCallback(experiment.stop, experiment.checkpoint_freq, report, prune, exploit)
    callbacks = [*trial.settings.get("callbacks", []), control]
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
    budget = int(experiment.stop.get("timesteps_total", trainer.config.total_timesteps))
    while True:
        if book is not None:  # where it is, and the values it trains with (a resumed trial's last move's)
            book.passed, book.params = book.point_of(trainer), _searched(trainer, experiment)
        with trainer:
            # at least one iteration, so a trial resumed at its budget still writes its result.json
            trainer.learn(max(budget - trainer.timesteps_total, 1))
        if (move := control.exploit) is None or trainer.timesteps_total >= budget:
            break
        assert book is not None
        control.exploit = None
        (run_dir / "result.json").unlink()  # not finished: killed before the next one, it resumes
        # on from this trial's own checkpoint at the point (its counters and episodes), with the new
        # values and the donor's learned state, saved at once: a resume goes on from the move
        before = trainer
        trainer = Trainer.from_checkpoint(
            move.own,
            callbacks=callbacks,
            verbose=verbose,
            run_dir=str(run_dir),
            **_objects(settings),
            **_overrides(trial.settings, move.params),
        )
        take_learned_state(trainer, move.checkpoint, before)
        del before  # its replay buffer, if any, is copied: not kept twice through the next stretch
        trainer.save()
        entry = {book.time_attr: move.point, "from": move.donor, "params": move.params}
        held = _update_trial_json(run_dir, {"exploits": [*held.get("exploits", []), entry]})
        if verbose:
            values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in move.params.items())
            print(
                f"shoal: trial {trial.name} at {book.time_attr}={move.point:,.6g} goes on from {move.donor} with "
                f"{values}",
                file=sys.stderr,
            )
    if control.pruned_at is not None:
        assert pruner is not None
        _update_trial_json(run_dir, {"pruned_at": {pruner.time_attr: control.pruned_at}})
        if verbose:
            print(
                f"shoal: trial {trial.name} stopped at {pruner.time_attr}={control.pruned_at:,.6g}: {pruner.why()}",
                file=sys.stderr,
            )
    return trainer.stop_reason


def _searched(trainer: Trainer, experiment: Experiment) -> dict[str, Any]:
    """The trainer's values of the experiment's searched keys, by dotted name."""
    config = trainer.config.to_yaml_dict()
    out = {}
    for path, _ in experiment.spaces:
        node = config
        for key in path:
            node = node[key]
        out[param_name(path)] = node
    return out


def _overrides(settings: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The config keys ``params`` (searched values by dotted name) change, as overrides of
    ``from_checkpoint`` (a nested key as a dict of what it changes)."""
    changed = with_values(settings, {tuple(name.split(".")): value for name, value in params.items()})
    return {name.split(".")[0]: changed[name.split(".")[0]] for name in params}


def _update_trial_json(run_dir: Path, entries: dict[str, Any]) -> dict[str, Any]:
    """``trial.json`` with ``entries`` set, keeping what it held (a resumed trial's ``pruned_at``
    and ``exploits``); returns what it now holds."""
    held = trial_record(run_dir) | entries
    write_atomic(run_dir / "trial.json", json.dumps(held, default=str))
    return held


def _objects(settings: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint cannot hold and a resume needs again: an env given as an object."""
    return {} if isinstance(settings["env"], str) else {"env": settings["env"]}


def finished(run_dir: Path) -> bool:
    """A trial ran to its end: ``result.json`` written by a run that was not interrupted."""
    path = run_dir / "result.json"
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("stop_reason") not in INTERRUPTED


def trial_record(run_dir: Path) -> dict[str, Any]:
    """What ``trial.json`` holds: the searched values, and where a scheduler or search stopped the
    trial early (``pruned_at``) or had it go on from another trial (``exploits``)."""
    path = run_dir / "trial.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def stopped_early(run_dir: Path) -> bool:
    """A trial that a scheduler or a search stopped before its criteria."""
    return "pruned_at" in trial_record(run_dir)


def run_sequential(experiments: list[Experiment], out: Path, verbose: int = 1) -> bool:
    """Every trial in turn, in this process. A trial that raises is reported (its traceback in
    ``error.txt``) and the others still run; an interrupt (Ctrl-C, SIGTERM) ends the sweep. False
    unless every trial finished."""
    from shoal.experiments.search import run_search  # it builds on run_trial

    complete = True
    for experiment in experiments:
        outcome = run_search(experiment, out, verbose) if experiment.search else _run_planned(experiment, out, verbose)
        if outcome == "interrupted":
            return False
        complete = complete and outcome == "done"
    return complete


def _run_planned(experiment: Experiment, out: Path, verbose: int) -> Outcome:
    planned = trials(experiment)
    outcome: Outcome = "done"
    for index, trial in enumerate(planned, start=1):
        run_dir = out / experiment.name / trial.name
        if finished(run_dir):
            continue
        if verbose:
            print(f"shoal: {experiment.name} trial {index}/{len(planned)}: {describe(trial)}", file=sys.stderr)
        try:
            if run_trial(trial, experiment, run_dir, verbose) in INTERRUPTED:
                return "interrupted"
        except Exception as e:
            record_failure(trial, run_dir, e)
            outcome = "incomplete"
    return outcome


def describe(trial: Trial) -> str:
    return ", ".join(f"{k}={v}" for k, v in trial.params.items())


def record_failure(trial: Trial, run_dir: Path, error: Exception) -> None:
    """A trial that raised: its traceback in ``error.txt``, one line on the console."""
    (run_dir / "error.txt").write_text(traceback.format_exc())
    print(f"shoal: {trial.experiment} trial {trial.name} ({describe(trial)}) failed: {error}", file=sys.stderr)


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
    """Each experiment as one Tune run over its planned trials (``trials``: the same ones, drawn
    the same way, as without Tune), at once as the cluster's CPUs allow or ``concurrent``; an
    experiment Tune already has state of is restored, its unfinished trials continuing from their
    last checkpoints. False unless every trial finished."""
    from shoal.experiments.search import run_search  # it builds on run_trial

    tune = tune_module()
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False)
    complete = True
    for experiment in experiments:
        if experiment.search is not None:  # drawn one trial at a time, in this process
            outcome = run_search(experiment, out)
            if outcome == "interrupted":
                return False
            complete = complete and outcome == "done"
            continue
        planned = trials(experiment)
        state = (out / "tune" / experiment.name).resolve()
        plan = state.parent / f"{experiment.name}.plan.json"
        names = [t.name for t in planned]
        trainable = tune.with_resources(
            tune.with_parameters(_tune_trial, experiment=experiment, planned=planned, out=str(out.resolve())),
            {"cpu": experiment.cpus_per_trial},
        )
        if tune.Tuner.can_restore(str(state)):
            if json.loads(plan.read_text()) != names:
                raise ConfigError(
                    f"experiment '{experiment.name}' changed since its sweep in '{state}' started; Tune restores a "
                    f"sweep as it was planned. Run the edited file with another --out, or delete '{state}'."
                )
            tuner = tune.Tuner.restore(str(state), trainable, resume_unfinished=True, resume_errored=True)
        else:
            state.parent.mkdir(parents=True, exist_ok=True)
            plan.write_text(json.dumps(names))
            tuner = tune.Tuner(
                trainable,
                param_space={"trial": tune.grid_search(names)},
                tune_config=tune.TuneConfig(
                    max_concurrent_trials=concurrent,
                    reuse_actors=True,  # a trial's process serves the next: torch and shoal import once
                    trial_name_creator=_trial_name,
                    trial_dirname_creator=_trial_name,
                ),
                run_config=tune.RunConfig(
                    name=experiment.name,
                    storage_path=str(state.parent),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    verbose=1,
                ),
            )
        grid = tuner.fit()
        complete = complete and not grid.errors and all(finished(out / experiment.name / name) for name in names)
    return complete


def _trial_name(trial: Any) -> str:
    name: str = trial.config["trial"]
    return name


def _tune_trial(params: dict[str, Any], experiment: Experiment, planned: list[Trial], out: str) -> None:
    """One Tune trial: a shoal run reporting each iteration to Tune, with its checkpoints."""
    from ray import tune

    (trial,) = [t for t in planned if t.name == params["trial"]]
    run_dir = Path(out) / experiment.name / trial.name
    if finished(run_dir):
        # Tune saves the sweep's state now and then, not at each trial's end: a trial that finished
        # just before an interrupt may come back from a restore as unfinished. It is not run again.
        return

    def report(result: dict[str, Any], path: Path | None) -> None:
        metrics = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}
        tune.report(metrics, checkpoint=None if path is None else tune.Checkpoint.from_directory(str(path)))

    checkpoint = tune.get_checkpoint()
    # the trial's own checkpoints, where it has them, are as new as Tune's or newer (a PBT move's)
    start = None if checkpoint is None or (run_dir / "checkpoints").is_dir() else Path(checkpoint.path)
    run_trial(trial, experiment, run_dir, verbose=0, report=report, start=start)
