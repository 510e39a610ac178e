"""Successive halving in `shoal tune` (``scheduler: {type: asha, ...}``): the rung rule against a
slow reference, the scheduler keys checked, and a sweep whose hopeless trials stop at the first
rung, count as finished, and are not run again when the sweep resumes."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from shoal.errors import ConfigError, ShoalWarning
from shoal.experiments import load_experiments, run_experiments
from shoal.experiments.run import RUNGS, RungBook, TrialCallback
from shoal.experiments.spec import Halving


def reference(arrivals, halving):
    """Each trial, in the order it reached the first rung, stops there when its value is below the
    (1 - 1/rf) quantile of the values that reached it before; a slow loop over the arrivals."""
    stopped, before = [], []
    for value in arrivals:
        cutoff = np.percentile(before, 100 * (1 - 1 / halving.reduction_factor)) if before else None
        stopped.append(cutoff is not None and value < cutoff)
        before.append(value)
    return stopped


# no subnormals: a trainer in the same process flushes them to zero (torch.set_flush_denormal)
@given(st.lists(st.floats(-100, 100, allow_subnormal=False), min_size=1, max_size=12), st.sampled_from([2, 3, 4]))
def test_the_first_rung_keeps_the_best_fraction_of_those_that_reached_it_before(tmp_path_factory, values, rf):
    halving = Halving("episode_reward_mean", grace_period=1000, reduction_factor=rf)
    book = RungBook(halving, tmp_path_factory.mktemp("rungs") / RUNGS)
    result = [
        book.pruned_at(f"t{i}", {"timesteps_total": 1500, "episode_reward_mean": v}) for i, v in enumerate(values)
    ]
    assert [r is not None for r in result] == reference(values, halving)
    assert all(r in (None, 1000) for r in result)


def test_each_rung_is_judged_once_per_trial_and_min_mode_keeps_the_lowest(tmp_path):
    book = RungBook(Halving("loss", grace_period=10, reduction_factor=2, mode="min"), tmp_path / RUNGS)
    assert book.pruned_at("a", {"timesteps_total": 10, "loss": 1.0}) is None
    assert book.pruned_at("b", {"timesteps_total": 10, "loss": 5.0}) == 10  # a higher loss is worse
    assert book.pruned_at("a", {"timesteps_total": 12, "loss": 9.0}) is None  # rung 10 judged a already
    assert book.pruned_at("c", {"timesteps_total": 5, "loss": 9.0}) is None  # below the first rung
    assert book.pruned_at("c", {"timesteps_total": 10, "loss": None}) is None  # no value yet: it passes
    assert json.loads((tmp_path / RUNGS).read_text()) == {"rungs": {"0": {"a": -1.0, "b": -5.0}}, "pruned": {"b": 10}}
    assert book.pruned_at("b", {"timesteps_total": 30, "loss": 0.0}) == 10  # stopped stays stopped (a resume)


def test_a_metric_the_results_lack_is_named_once(tmp_path):
    book = RungBook(Halving("episode_reward_men", grace_period=10), tmp_path / RUNGS)
    result = {"timesteps_total": 10, "episode_reward_mean": 1.0}
    with pytest.warns(ShoalWarning, match="'episode_reward_men' is not in the trials' results.*'episode_reward_mean'"):
        assert book.pruned_at("a", result) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert book.pruned_at("b", result) is None


def test_a_result_past_several_rungs_is_judged_at_the_highest_alone(tmp_path):
    book = RungBook(Halving("r", grace_period=10, reduction_factor=2), tmp_path / RUNGS)
    assert book.pruned_at("a", {"timesteps_total": 45, "r": 1.0}) is None  # rungs 10, 20 and 40 passed
    assert book.pruned_at("b", {"timesteps_total": 40, "r": 0.5}) == 40
    assert json.loads((tmp_path / RUNGS).read_text())["rungs"] == {"2": {"a": 1.0, "b": 0.5}}


def test_a_trial_that_reaches_its_stop_at_a_rung_is_not_pruned():
    control = TrialCallback({"timesteps_total": 40}, 0, prune=lambda result: 40)
    assert control.on_train_result(None, {"timesteps_total": 40}) and control.pruned_at is None
    assert control.on_train_result(None, {"timesteps_total": 20}) and control.pruned_at == 40


def sweep(**scheduler):
    return {
        "halving": {
            "algo": "ppo",
            "env": "CartPole-v1",
            "stop": {"timesteps_total": 8192},
            "seeds": [1],
            "checkpoint_freq": 0,
            "scheduler": {"type": "asha", "metric": "episode_reward_mean", "grace_period": 4096} | scheduler,
            "config": {"learning_rate": {"grid_search": [3e-3, 1e-3, 1e-12, 1e-13]}, "num_envs": 8},
        }
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"type": "hyperband"}, "scheduler type 'hyperband': one of 'asha', 'pbt'"),
        ({"metric": ""}, "scheduler.metric names a result key"),
        ({"grace_period": 0}, "scheduler.grace_period must be a number > 0"),
        ({"reduction_factor": 1}, "scheduler.reduction_factor must be a number > 1"),
        ({"time_attr": "episodes"}, "scheduler.time_attr 'episodes': one of timesteps_total"),
        ({"mode": "best"}, "scheduler.mode 'best': 'max' or 'min'"),
        ({"grace_perod": 1}, "unknown scheduler key 'grace_perod'. Did you mean 'grace_period'"),
        ({"grace_period": "1e6"}, r"scheduler.grace_period '1e6' is text; write 1.0e6"),
    ],
)
def test_bad_scheduler_keys_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        load_experiments(sweep(**change))
    spec = sweep()
    del spec["halving"]["scheduler"]["grace_period"]
    with pytest.raises(ConfigError, match="scheduler.grace_period is required"):
        load_experiments(spec)


@pytest.mark.slow
def test_trials_that_learn_nothing_stop_at_the_first_rung_and_a_resume_runs_none_again(tmp_path, capsys):
    assert run_experiments(sweep(), tmp_path, sequential=True, verbose=1)
    runs = {json.loads(p.read_text())["params"]["learning_rate"]: p.parent for p in tmp_path.rglob("trial.json")}
    steps = {lr: json.loads((run / "result.json").read_text())["timesteps_total"] for lr, run in runs.items()}
    assert steps[3e-3] == 8192  # the first to reach each rung goes on
    for lr in (1e-12, 1e-13):  # a step size that moves nothing: far below the learners at 4096 steps
        assert steps[lr] == 4096
        assert json.loads((runs[lr] / "trial.json").read_text())["pruned_at"] == {"timesteps_total": 4096}
    assert "stopped at timesteps_total=4,096" in capsys.readouterr().err
    assert (tmp_path / "results.md").read_text().count("| 1 of 1 (1 stopped early) |") == 2
    mtimes = {lr: (run / "result.json").stat().st_mtime_ns for lr, run in runs.items()}
    assert run_experiments(sweep(), tmp_path, sequential=True, verbose=0)
    assert mtimes == {lr: (run / "result.json").stat().st_mtime_ns for lr, run in runs.items()}


def test_the_documented_scheduler_example_is_a_valid_experiment():
    text = (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()
    block = text.split("```yaml\ncartpole-lr:")[1].split("```")[0]
    (experiment,) = load_experiments(yaml.safe_load("cartpole-lr:" + block))
    assert experiment.halving == Halving("episode_reward_mean", grace_period=10000)
    assert experiment.halving.rungs_passed(100_000) == [10000, 30000, 90000]


@pytest.mark.slow
def test_on_tune_the_trials_running_at_once_share_their_rungs(ray_cluster, tmp_path):
    """Two trials at a time: the two that learn reach the first rung before the two that cannot
    start, which then stop there, as without Tune; each trial's value is in the one rung file."""
    assert run_experiments(sweep(), tmp_path, sequential=False, concurrent=2, verbose=0)
    runs = {json.loads(p.read_text())["params"]["learning_rate"]: p for p in tmp_path.glob("halving/*/trial.json")}
    for lr in (1e-12, 1e-13):
        assert json.loads(runs[lr].read_text())["pruned_at"] == {"timesteps_total": 4096}
    # the first of the two that learn to reach the rung goes on (which one is first varies on Tune)
    assert any("pruned_at" not in json.loads(runs[lr].read_text()) for lr in (3e-3, 1e-3))
    rungs = json.loads((tmp_path / "halving" / RUNGS).read_text())["rungs"]
    assert set(rungs["0"]) == {p.parent.name for p in runs.values()}  # all four judged at rung 0 (4096)
