"""Optuna's search in `shoal tune` (``search: {type: optuna, ...}``): the median rule against a slow
reference, the search keys checked, and a sweep whose trials are drawn one at a time, stop early
where they fall below the median, and continue after an interrupt from their own checkpoints."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.errors import ConfigError
from shoal.experiments import load_experiments, run_experiments
from shoal.experiments.search import STUDY, MedianRule
from shoal.experiments.spec import Search
from tests.interrupts import InterruptAt

optuna = pytest.importorskip("optuna")


def reference(values, startup):
    """Trial i (in order, one value at the judged point) stops when at least ``startup`` trials
    finished before it and its value is below the median of theirs; stopped ones are not counted."""
    finished, stopped = [], []
    for value in values:
        stop = len(finished) >= startup and value < np.median(finished)
        stopped.append(bool(stop))
        if not stop:
            finished.append(value)
    return stopped


@settings(max_examples=30, deadline=None)  # each example is a fresh in-memory study
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=10), st.integers(0, 3))
def test_a_trial_stops_below_the_median_of_the_finished_trials_at_the_same_point(values, startup):
    search = Search("episode_reward_mean", grace_period=1000, startup_trials=startup)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=startup))
    stopped = []
    for value in values:
        trial = study.ask()
        rule = MedianRule(search, trial)
        at = rule.pruned_at("t", {"timesteps_total": 1500, "episode_reward_mean": float(value)})
        stopped.append(at is not None)
        if at is None:
            study.tell(trial, float(value))
        else:
            assert at == 1000  # judged at the multiple of grace_period it passed
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert stopped == reference(values, startup)


def test_each_point_is_reported_once_and_a_result_without_the_metric_waits():
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    rule = MedianRule(Search("r", grace_period=10), trial)
    assert rule.pruned_at("t", {"timesteps_total": 5, "r": 1.0}) is None  # before the first point
    assert rule.pruned_at("t", {"timesteps_total": 10, "r": None}) is None  # no episode ended yet
    rule.pruned_at("t", {"timesteps_total": 12, "r": 2.0})
    rule.pruned_at("t", {"timesteps_total": 19, "r": 3.0})  # point 10 reported already
    rule.pruned_at("t", {"timesteps_total": 35, "r": 4.0})  # past 20 and 30: reported at 30 alone
    assert study.trials[0].intermediate_values == {1: 2.0, 3: 4.0}  # by point: the same steps for every trial


def sweep(**search):
    return {
        "drawn": {
            "algo": "ppo",
            "env": "CartPole-v1",
            "stop": {"timesteps_total": 4096},
            "seeds": [1],
            "num_samples": 5,
            "checkpoint_freq": 1,
            "search": {"type": "optuna", "metric": "episode_reward_mean", "grace_period": 2048, "startup_trials": 2}
            | search,
            "config": {"learning_rate": {"loguniform": [1e-6, 1e-2]}, "num_envs": 8},
        }
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"search": {"type": "hyperopt"}}, "search type 'hyperopt': the one type is 'optuna'"),
        ({"search": {"startup_trials": -1}}, "search.startup_trials must be an integer >= 0"),
        ({"search": {"grace_period": 0}}, "search.grace_period must be a number > 0"),
        ({"search": {"metrc": "x"}}, "unknown search key 'metrc'. Did you mean 'metric'"),
        ({"seeds": [1, 2]}, "search: optuna runs one seed per trial, got seeds \\[1, 2\\]"),
        (
            {"scheduler": {"type": "asha", "metric": "episode_reward_mean", "grace_period": 10}},
            "search: optuna judges its trials itself",
        ),
        (
            {"config": {"model_config": {"hiddens": {"choice": [[64], [64, 64]]}}}},
            r"config.model_config.hiddens: Optuna chooses among numbers, text, booleans and null, got \[64\]",
        ),
    ],
)
def test_bad_search_keys_are_named(change, message):
    spec = sweep()
    for key, value in change.items():
        spec["drawn"][key] = spec["drawn"][key] | value if key == "search" else value
    with pytest.raises(ConfigError, match=message):
        load_experiments(spec)


@pytest.mark.slow
def test_a_search_draws_its_trials_stops_the_weak_and_resumes_an_interrupted_one(tmp_path, capsys):
    spec = sweep()
    spec["drawn"]["config"]["callbacks"] = [InterruptAt(iteration=1)]  # the first trial, after one iteration
    assert not run_experiments(spec, tmp_path, sequential=True, verbose=0)
    (interrupted,) = list((tmp_path / "drawn").glob("trial_*/"))
    assert json.loads((interrupted / "result.json").read_text())["stop_reason"] == "SIGINT"

    del spec["drawn"]["config"]["callbacks"]
    assert run_experiments(spec, tmp_path, sequential=True, verbose=1)
    runs = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "drawn").glob("trial_*/trial.json")}
    assert len(runs) == 5 and interrupted.name in runs  # the interrupted trial went on in its own directory
    result = json.loads((interrupted / "result.json").read_text())
    assert result["stop_reason"] != "SIGINT" and result["timesteps_total"] >= 2048

    study = optuna.load_study(study_name="drawn", storage=f"sqlite:///{tmp_path / 'drawn' / STUDY}")
    states = [t.state.name for t in study.trials]
    assert states.count("FAIL") == 1  # the interrupted run's trial, asked again as the next one
    assert states.count("COMPLETE") + states.count("PRUNED") == 5
    pruned = [name for name, trial in runs.items() if "pruned_at" in trial]
    assert pruned and states.count("PRUNED") == len(pruned)  # with these draws, the fourth falls below
    for name in pruned:  # stopped at the first judged point, below the median
        assert runs[name]["pruned_at"] == {"timesteps_total": 2048}
        assert json.loads((tmp_path / "drawn" / name / "result.json").read_text())["timesteps_total"] == 2048
    assert "results.md" in capsys.readouterr().err
    table = (tmp_path / "results.md").read_text()
    assert table.count("| 1 of 1") == 5
    assert table.count("stopped early") == len(pruned)

    mtimes = {name: (tmp_path / "drawn" / name / "result.json").stat().st_mtime_ns for name in runs}
    assert run_experiments(spec, tmp_path, sequential=True, verbose=0)  # all five ended: nothing runs
    assert mtimes == {name: (tmp_path / "drawn" / name / "result.json").stat().st_mtime_ns for name in runs}

    spec["drawn"]["config"]["learning_rate"] = {"loguniform": [1e-5, 1e-2]}  # an edited file
    with pytest.raises(ConfigError, match=r"search spaces changed since the study in '.*optuna.db' began"):
        run_experiments(spec, tmp_path, sequential=True, verbose=0)


def test_the_documented_example_is_a_valid_experiment():
    text = (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()
    block = text.split("```yaml\ncartpole-optuna:")[1].split("```")[0]
    (experiment,) = load_experiments(yaml.safe_load("cartpole-optuna:" + block))
    assert experiment.search == Search("episode_reward_mean", grace_period=20000)
    assert experiment.num_samples == 20 and experiment.seeds == [1]
