"""Population-based training in `shoal tune` (``scheduler: {type: pbt, ...}``): the perturbation
rule against its definition, the exploit decision, the scheduler keys checked, and a sweep whose
hopeless trial goes on from the best one's state and values."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from shoal.errors import ConfigError
from shoal.experiments import load_experiments, run_experiments
from shoal.experiments.population import BOOK, POINTS, PopulationBook, explore
from shoal.experiments.spec import Population, Space
from shoal.train import checkpoint as ckpt

SPACES = [
    (("learning_rate",), Space("loguniform", [1e-5, 1e-2])),
    (("ent_coef",), Space("uniform", [0.0, 0.1])),
    (("num_sgd_iter",), Space("randint", [1, 20])),
    (("gamma",), Space("grid_search", [0.9, 0.99, 0.999])),
    (("policies", "main", "clip_param"), Space("choice", [0.1, 0.2, 0.3])),
]
START = {"learning_rate": 1e-3, "ent_coef": 0.05, "num_sgd_iter": 10, "gamma": 0.99, "policies.main.clip_param": 0.1}


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 1.0]))
def test_explore_moves_each_value_by_its_rule_or_redraws_it(seed, resample):
    out = explore(START, SPACES, resample, np.random.default_rng(seed))
    assert set(out) == set(START)
    for (_, space), name in zip(SPACES, START):
        value, before = out[name], START[name]
        if space.kind in ("grid_search", "choice"):
            assert value in space.values
            if not resample:  # a neighbour, held at the ends
                step = space.values.index(value) - space.values.index(before)
                at_end = space.values.index(before) in (0, len(space.values) - 1)
                assert abs(step) == 1 or (step == 0 and at_end)
            continue
        low, high = space.values
        assert low <= value <= high
        if resample:
            continue
        if space.kind == "randint":
            assert value in (min(round(before * f), high - 1) for f in (0.8, 1.2))
        else:
            assert value in (pytest.approx(min(max(before * f, low), high)) for f in (0.8, 1.2))


class FakeTrainer:
    def save(self, path):
        path.mkdir(parents=True)
        return path


def arrive(tmp_path, trial, score, population, params=None):
    book = PopulationBook(population, SPACES[:1], tmp_path / BOOK, trial)
    book.params = params or {"learning_rate": 1e-3}
    return book.at_point(FakeTrainer(), {"timesteps_total": 1500, "r": score})


def test_a_trial_among_the_worst_at_a_point_goes_on_from_one_of_the_best(tmp_path):
    population = Population("r", perturbation_interval=1000, quantile_fraction=0.25, resample_probability=0.0)
    assert arrive(tmp_path, "a", 5.0, population, {"learning_rate": 4e-3}) is None  # alone: nobody to judge
    assert arrive(tmp_path, "b", 1.0, population) is None  # two: a quarter of them is nobody
    assert arrive(tmp_path, "c", 3.0, population) is None
    move = arrive(tmp_path, "d", 1.0, population)  # as bad as b, and later: the worst quarter
    assert move is not None and move.donor == "a" and move.point == 1000
    assert move.own == tmp_path / "d" / POINTS / "point_1"
    assert move.checkpoint == tmp_path / "a" / POINTS / "point_1"
    assert move.params["learning_rate"] in (pytest.approx(3.2e-3), pytest.approx(4.8e-3))
    book = json.loads((tmp_path / BOOK).read_text())
    assert {name: entry["score"] for name, entry in book["1"].items()} == {"a": 5.0, "b": 1.0, "c": 3.0, "d": 1.0}
    assert arrive(tmp_path, "e", 9.0, population) is None  # the best is never moved


def test_in_min_mode_the_highest_values_are_the_worst(tmp_path):
    population = Population("r", perturbation_interval=1000, quantile_fraction=0.5, mode="min")
    assert arrive(tmp_path, "a", 1.0, population) is None
    move = arrive(tmp_path, "b", 2.0, population)
    assert move is not None and move.donor == "a"


def sweep(**scheduler):
    return {
        "pop": {
            "algo": "ppo",
            "env": "CartPole-v1",
            "stop": {"timesteps_total": 8192},
            "seeds": [1],
            "checkpoint_freq": 0,
            "scheduler": {"type": "pbt", "metric": "episode_reward_mean", "perturbation_interval": 2048} | scheduler,
            "config": {"learning_rate": {"grid_search": [3e-3, 1e-3, 1e-12, 1e-13]}, "num_envs": 8},
        }
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"quantile_fraction": 0.7}, r"scheduler.quantile_fraction must be a number in \[0, 0.5\], got 0.7"),
        ({"resample_probability": -1}, r"scheduler.resample_probability must be a number in \[0, 1.0\]"),
        ({"perturbation_interval": "1e6"}, "scheduler.perturbation_interval '1e6' is text"),
        ({"grace_period": 10}, "unknown scheduler key 'grace_period'"),
    ],
)
def test_bad_population_keys_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        load_experiments(sweep(**change))
    spec = sweep()
    del spec["pop"]["scheduler"]["perturbation_interval"]
    with pytest.raises(ConfigError, match="scheduler.perturbation_interval is required"):
        load_experiments(spec)


def test_what_population_based_training_cannot_perturb_is_refused():
    spec = sweep()
    spec["pop"]["config"] = {"model_config": {"hiddens": {"choice": [[32], [64]]}}}
    with pytest.raises(ConfigError, match="config.model_config.hiddens: population-based training cannot search it"):
        load_experiments(spec)
    spec["pop"]["config"] = {"learning_rate": 1e-3}
    with pytest.raises(ConfigError, match="'pbt' perturbs the searched values: give config a search space"):
        load_experiments(spec)


@pytest.mark.slow
def test_a_hopeless_trial_goes_on_from_the_best_one_and_learns(tmp_path, capsys):
    """Four step sizes, two that move nothing: the fourth to reach 2,048 steps is among the worst
    quarter there and goes on from the best trial's state with its step size moved to a neighbour
    in the list; the third, judged among three, never moves."""
    assert run_experiments(sweep(resample_probability=0.0), tmp_path, sequential=True, verbose=1)
    trials = {json.loads(p.read_text())["params"]["learning_rate"]: p.parent for p in tmp_path.glob("pop/*/trial.json")}
    record = json.loads((trials[1e-13] / "trial.json").read_text())
    (move,) = record["exploits"]
    there = json.loads((tmp_path / "pop" / BOOK).read_text())["1"]  # what each had at 2,048 steps
    best = max(there, key=lambda name: there[name]["score"])
    assert best in (trials[3e-3].name, trials[1e-3].name)
    donor_lr = there[best]["params"]["learning_rate"]
    neighbours = {3e-3: [1e-3, 3e-3], 1e-3: [3e-3, 1e-12]}[donor_lr]  # 3e-3 is held at the list's end
    assert move["timesteps_total"] == 2048 and move["from"] == best
    assert move["params"]["learning_rate"] in neighbours
    assert "goes on from" in capsys.readouterr().err
    finals = {lr: json.loads((run / "result.json").read_text()) for lr, run in trials.items()}
    assert all(final["timesteps_total"] == 8192 for final in finals.values())
    # the moved trial learns from the donor's weights; its twin that did not move stays at random play
    last = {lr: final["metric_analysis"]["rollout/episode_reward_mean"]["last"] for lr, final in finals.items()}
    assert last[1e-13] > 2 * last[1e-12]
    state, _ = ckpt.read_checkpoint(ckpt.resolve_checkpoint(trials[1e-13]))
    assert state["config"]["learning_rate"] == move["params"]["learning_rate"]  # later checkpoints keep it
    assert "1 of 1 (1 went on from better trials)" in (tmp_path / "results.md").read_text()
    mtimes = {lr: (run / "result.json").stat().st_mtime_ns for lr, run in trials.items()}
    assert run_experiments(sweep(resample_probability=0.0), tmp_path, sequential=True, verbose=0)
    assert mtimes == {lr: (run / "result.json").stat().st_mtime_ns for lr, run in trials.items()}


def test_the_documented_example_is_a_valid_experiment():
    text = (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()
    block = text.split("```yaml\nlunarlander-pbt:")[1].split("```")[0]
    (experiment,) = load_experiments(yaml.safe_load("lunarlander-pbt:" + block))
    assert experiment.population == Population("episode_reward_mean", perturbation_interval=100000)
    assert [name for name, _ in experiment.spaces] == [("learning_rate",), ("ent_coef",)]
