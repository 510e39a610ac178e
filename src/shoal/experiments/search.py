"""``search: {type: optuna, ...}``: an experiment's trials drawn one at a time by Optuna's TPE
sampler from the results of the trials before them, and stopped early by its median rule, in this
process (on Tune too: the trials of a search run in turn).

The study lives beside the trials, in ``OUT/<experiment>/optuna.db`` (SQLite), so the same command
resumes the search. A trial is a shoal run like any other, named by its values: one that an
interrupt left unfinished is asked again with the same values, and so continues from its
checkpoint; values drawn a second time reuse the finished run.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import ConfigError
from shoal.experiments.books import Reading
from shoal.experiments.run import (
    INTERRUPTED,
    Outcome,
    describe,
    finished,
    record_failure,
    run_trial,
    stopped_early,
)
from shoal.experiments.spec import Experiment, Path_, Search, Space, make_trial, param_name
from shoal.logging.runs import load_run, resolve_metric

if TYPE_CHECKING:
    import optuna

STUDY = "optuna.db"  # in OUT/<experiment>/
FAILED = "shoal_error"  # a failed trial's user attribute: failed by raising, not left by an interrupt


class MedianRule:
    """Optuna's median pruner for one trial: its ``metric`` is reported at each multiple ``k`` of
    ``grace_period`` of ``time_attr`` it passes, as step ``k`` (the same points for every trial,
    whatever their batch sizes), and the trial stops where the pruner finds it worse than the
    median there."""

    def __init__(self, search: Search, trial: optuna.Trial):
        self.search, self.trial = search, trial
        self.time_attr = search.time_attr
        self.reading = Reading("search", search.metric, search.time_attr)
        self.judged = 0

    def why(self) -> str:
        return f"its {self.search.metric} was worse than the median of the earlier trials there"

    def pruned_at(self, trial: str, result: dict[str, Any]) -> float | None:
        if (reading := self.reading(result)) is None:
            return None
        progress, value = reading
        point = int(progress // self.search.grace_period)
        if point <= self.judged:
            return None
        self.judged = point
        self.trial.report(value, point)
        return point * self.search.grace_period if self.trial.should_prune() else None


def run_search(experiment: Experiment, out: Path, verbose: int = 1) -> Outcome:
    """Draw and run trials until ``num_samples`` of them have finished (or stopped early, or
    failed); each finished one tells the study its last ``metric``."""
    optuna = _optuna()
    from optuna.trial import TrialState

    search = experiment.search
    assert search is not None
    folder = out / experiment.name
    folder.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # shoal prints each trial itself
    study = optuna.create_study(
        storage=f"sqlite:///{(folder / STUDY).resolve()}",
        study_name=experiment.name,
        direction="maximize" if search.mode == "max" else "minimize",
        load_if_exists=True,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials),
    )
    _same_spaces(study, experiment, folder / STUDY)
    # seeded by the name and the trials so far: a resumed search draws new values, not its first ones again
    seed = (zlib.crc32(experiment.name.encode()) + len(study.trials)) % 2**32
    study.sampler = optuna.samplers.TPESampler(n_startup_trials=search.startup_trials, seed=seed)
    for left in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # an interrupted sweep's trial: ended here, and its values asked for again next
        study.tell(left.number, state=TrialState.FAIL)
        study.enqueue_trial(left.params)
    outcome: Outcome = "done"
    while (count := _ended(study)) < experiment.num_samples:
        asked = study.ask()
        values = {path: _suggest(asked, path, space) for path, space in experiment.spaces}
        trial = make_trial(experiment, values, experiment.seeds[0])
        run_dir = folder / trial.name
        if verbose:
            where = f"{experiment.name} trial {count + 1}/{experiment.num_samples}"
            print(f"shoal: {where}: {describe(trial)}", file=sys.stderr)
        rule = MedianRule(search, asked)
        try:
            if not finished(run_dir) and run_trial(trial, experiment, run_dir, verbose, pruner=rule) in INTERRUPTED:
                return "interrupted"  # the trial stays RUNNING in the study: the next run asks it again
        except Exception as e:
            record_failure(trial, run_dir, e)
            asked.set_user_attr(FAILED, str(e))
            study.tell(asked, state=TrialState.FAIL)
            outcome = "incomplete"
            continue
        value, state = _result(run_dir, search)
        if value is None and state == TrialState.FAIL:  # no episode ended: counted, with nothing to learn from
            asked.set_user_attr(FAILED, f"no {search.metric} in its results")
        study.tell(asked, value, state)
    return outcome


def _same_spaces(study: optuna.Study, experiment: Experiment, path: Path) -> None:
    """Record the experiment's search spaces with a new study; refuse to go on with a study of
    other spaces (an edited file), whose trials Optuna could not compare with the new ones."""
    spaces = json.dumps({param_name(p): [s.kind, s.values] for p, s in experiment.spaces}, default=str)
    held = study.user_attrs.get("spaces")
    if held is None:
        study.set_user_attr("spaces", spaces)
    elif held != spaces:
        raise ConfigError(
            f"experiment '{experiment.name}': its search spaces changed since the study in '{path}' began; run the "
            f"edited file with another --out, or delete '{path.parent}'."
        )


def _ended(study: optuna.Study) -> int:
    """Trials that count toward ``num_samples``: finished, stopped early, or failed by raising."""
    return sum(
        t.state.name in ("COMPLETE", "PRUNED") or (t.state.name == "FAIL" and FAILED in t.user_attrs)
        for t in study.get_trials(deepcopy=False)
    )


def _result(run_dir: Path, search: Search) -> tuple[float | None, Any]:
    """``(value, state)`` to tell the study of a trial that ran to its end or was stopped early (in
    this run, or in the earlier one whose directory the same values reuse): its last ``metric``."""
    from optuna.trial import TrialState

    if stopped_early(run_dir):
        return None, TrialState.PRUNED
    values: list[float] = []
    run = load_run(run_dir)
    with contextlib.suppress(ConfigError):  # a metric the run never logged: no value
        values = [v for v in run.series(resolve_metric([run], search.metric)) if math.isfinite(v)]
    return (float(values[-1]), TrialState.COMPLETE) if values else (None, TrialState.FAIL)


def _suggest(trial: optuna.Trial, path: Path_, space: Space) -> Any:
    """The value Optuna draws for one search space: a choice among a list's values (grid_search
    included: Optuna searches it, it does not enumerate it), or a number in a range."""
    name = param_name(path)
    if space.kind in ("grid_search", "choice"):
        return trial.suggest_categorical(name, space.values)
    low, high = space.values
    if space.kind == "randint":
        return trial.suggest_int(name, int(low), int(high) - 1)  # randint's high is exclusive
    return trial.suggest_float(name, float(low), float(high), log=space.kind == "loguniform")


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "an experiment with `search: {type: optuna}` needs Optuna: pip install 'shoal[optuna]'."
        ) from None
    return optuna
