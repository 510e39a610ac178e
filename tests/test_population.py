"""Population-based training in `shoal tune` (``scheduler: {type: pbt, ...}``): the perturbation
rule against its definition, the exploit decision, the scheduler keys checked, and a sweep whose
hopeless trial goes on from the best one's state and values."""

import contextlib
import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

import shoal
from shoal.errors import ConfigError, ShoalWarning
from shoal.experiments import load_experiments, run_experiments
from shoal.experiments.population import (
    BOOK,
    POINTS,
    PopulationBook,
    explore,
    movers,
    shapes,
    take_learned_state,
)
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


@pytest.mark.parametrize(
    "arrived, fraction, expected", [(1, 0.25, 0), (2, 0.25, 1), (4, 0.25, 1), (5, 0.25, 2), (9, 0.5, 4), (3, 0.0, 0)]
)
def test_a_fraction_rounded_up_and_at_most_half_of_the_trials_move(arrived, fraction, expected):
    assert movers(arrived, fraction) == expected


class FakeTrainer:
    """What the book reads of a trainer: it saves a checkpoint, and has learned state of a shape."""

    def __init__(self, width=2):
        self.algorithm = SimpleNamespace(state_dict=lambda: {"policy": {"weight": torch.zeros(width)}})

    def save(self, path):
        path.mkdir(parents=True)
        return path


MEMBERS = ["a", "b", "c", "d", "e"]


def arrive(tmp_path, trial, score, population, params=None, steps=1500, width=2):
    book = PopulationBook(population, SPACES[:1], tmp_path / BOOK, trial, MEMBERS)
    book.params = params or {"learning_rate": 1e-3}
    book.passed = int(steps // population.perturbation_interval) - 1
    return book.at_point(FakeTrainer(width), {"timesteps_total": steps, "r": score})


def test_a_trial_among_the_worst_at_a_point_goes_on_from_one_of_the_best(tmp_path):
    population = Population("r", perturbation_interval=1000, quantile_fraction=0.25, resample_probability=0.0)
    assert arrive(tmp_path, "a", 5.0, population, {"learning_rate": 4e-3}) is None  # alone: nobody to judge
    move = arrive(tmp_path, "b", 1.0, population)  # the worse of two
    assert move is not None and move.donor == "a" and move.point == 1000
    assert move.own == tmp_path / "b" / POINTS / "point_1"
    assert move.checkpoint == tmp_path / "a" / POINTS / "point_1"
    assert move.params["learning_rate"] in (pytest.approx(3.2e-3), pytest.approx(4.8e-3))
    assert arrive(tmp_path, "c", 3.0, population) is None  # of three, one moves: b is the worst
    move = arrive(tmp_path, "d", 1.0, population)  # as bad as b, and later: the worst
    assert move is not None and move.donor == "a"
    assert arrive(tmp_path, "e", 9.0, population) is None  # of five, two move: d and b; the best never
    book = json.loads((tmp_path / BOOK).read_text())
    assert {name: e["score"] for name, e in book["1"].items()} == {"a": 5.0, "b": 1.0, "c": 3.0, "d": 1.0, "e": 9.0}


def test_in_min_mode_the_highest_values_are_the_worst(tmp_path):
    population = Population("r", perturbation_interval=1000, mode="min")
    assert arrive(tmp_path, "a", 1.0, population) is None
    move = arrive(tmp_path, "b", 2.0, population)
    assert move is not None and move.donor == "a"


def test_the_checkpoints_at_a_point_every_trial_passed_are_deleted(tmp_path):
    population = Population("r", perturbation_interval=1000)
    for name in MEMBERS:
        arrive(tmp_path, name, 1.0, population)
    assert (tmp_path / "a" / POINTS / "point_1").is_dir()
    for name in MEMBERS:
        arrive(tmp_path, name, 1.0, population, steps=2500)
    assert not list(tmp_path.glob(f"*/{POINTS}/point_1")) and len(list(tmp_path.glob(f"*/{POINTS}/point_2"))) == 5
    assert list(json.loads((tmp_path / BOOK).read_text())) == ["2"]


def test_trials_whose_state_differs_in_shape_are_named(tmp_path):
    population = Population("r", perturbation_interval=1000)
    arrive(tmp_path, "a", 1.0, population, {"learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="trials b and a have networks of different shapes .*differ in learning_rate"):
        arrive(tmp_path, "b", 2.0, population, {"learning_rate": 2e-3}, width=3)


def test_a_donor_whose_checkpoint_is_gone_is_not_moved_to(tmp_path):
    population = Population("r", perturbation_interval=1000)
    arrive(tmp_path, "a", 5.0, population)
    shutil.rmtree(tmp_path / "a")
    with pytest.warns(ShoalWarning, match="a's checkpoint .* is gone; b goes on"):
        assert arrive(tmp_path, "b", 1.0, population) is None


def test_a_value_no_longer_in_its_list_is_drawn_anew():
    space = [(("gamma",), Space("choice", [0.9, 0.99]))]
    out = explore({"gamma": 0.95}, space, 0.0, np.random.default_rng(0))  # an edited list
    assert out["gamma"] in (0.9, 0.99)


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


def kill_after_the_first_move(spec, out):
    """Run the sweep in a process of its own and kill it (SIGKILL: no checkpoint, no result.json)
    as soon as a trial has moved; returns that trial's directory."""
    file = out / "sweep.yaml"
    file.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "shoal", "tune", str(file), "--sequential", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            for record in out.glob("pop/*/trial.json"):
                with contextlib.suppress(ValueError):  # caught mid-write
                    if json.loads(record.read_text()).get("exploits"):
                        process.kill()
                        process.wait()
                        return record.parent
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()
    raise AssertionError("no trial moved before the sweep ended")


# how the trial moves: (what its own run and the donor store, the changed settings, whose buffer it then holds)
MOVES = {
    "own": ({}, {}, {}, "own"),
    "none": ({}, {}, {}, "empty"),  # nothing of its own to keep: a trial resumed at the move
    "donor stored": ({}, {"store_buffer_in_checkpoints": True}, {}, "own"),
    "resized": ({}, {}, {"buffer_size": 1000}, "empty"),
    "prioritized": ({}, {}, {"prioritized_replay": True}, "empty"),
    "resized, both stored": ({"store_buffer_in_checkpoints": True},) * 2 + ({"buffer_size": 1000}, "empty"),
    "resized to the donor's": (
        {"store_buffer_in_checkpoints": True},
        {"store_buffer_in_checkpoints": True, "buffer_size": 1000},
        {"buffer_size": 1000},
        "donor",
    ),
}


@pytest.mark.parametrize("move", list(MOVES))
def test_a_replay_learner_that_moves_goes_on_learning_with_its_own_buffer(tmp_path, move):
    """The moving trial keeps the experience it had at the point, which goes on from its own envs
    (even when the donor's checkpoint holds a buffer). When the move changes the buffer's layout it
    takes the donor's stored buffer if that fits, else it refills for ``learning_starts`` steps
    first, as it does given nothing to keep; a trial's stored buffer does not count among the
    shapes that must match across the population."""
    own_keeps, donor_keeps, changed, holds = MOVES[move]
    small = dict(env="CartPole-v1", rollout_fragment_length=16, gradient_steps=4, learning_starts=128)
    small |= dict(timesteps_per_iteration=64, buffer_size=2000, sgd_minibatch_size=32, verbose=0)
    own = shoal.DQN(run_dir=str(tmp_path / "own"), seed=1, **small | own_keeps)
    donor = shoal.DQN(run_dir=str(tmp_path / "donor"), seed=2, **small | donor_keeps)
    for _ in range(4):
        own.train(), donor.train()
    assert shapes(own) == shapes(donor)
    own_point, donor_point = own.save(), donor.save()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = shoal.DQN.from_checkpoint(own_point, run_dir=str(tmp_path / "own"), **changed)
        take_learned_state(moved, donor_point, None if move == "none" else own)
    stored_but_resized = own_keeps and changed
    assert [str(w.message).split(")")[0] for w in caught] == (
        ["the checkpoint's replay buffer (1 x 2000 steps"] if stored_but_resized else []
    )
    replay = moved.algorithm.replay
    source = {"own": own, "donor": donor}.get(holds)
    assert len(replay) == (0 if source is None else len(source.algorithm.replay))
    if source is not None:
        assert torch.equal(replay.storage["obs"], source.algorithm.replay.storage["obs"])
    assert all(torch.equal(a, b) for a, b in zip(moved.get_policy().parameters(), donor.get_policy().parameters()))
    steps = moved.algorithm.gradient_steps
    assert (moved.train()["num_gradient_steps"] > steps) is (source is not None)


@pytest.mark.slow
def test_hopeless_trials_go_on_from_the_best_ones_and_learn_and_a_move_survives_a_kill(tmp_path, capsys):
    """Four step sizes, two that move nothing: each of those is the worst when it reaches 2,048
    steps and goes on from a trial that learns, with a step size from that trial's list
    neighbours, and ends far above random play. A trial killed after its move resumes from the
    move, with the values it moved to."""
    spec = sweep(resample_probability=0.0)
    moved = kill_after_the_first_move(spec, tmp_path)
    assert not (moved / "result.json").exists()  # not taken for finished
    (move,) = json.loads((moved / "trial.json").read_text())["exploits"]
    # its newest checkpoint is the move: the donor's learned state there, with the moved-to values
    newest, _ = ckpt.read_checkpoint(ckpt.resolve_checkpoint(moved))
    donor, _ = ckpt.read_checkpoint(
        tmp_path / "pop" / move["from"] / POINTS / f"point_{move['timesteps_total'] // 2048}"
    )
    weights = [(key, value) for key, value in donor["algorithm"]["policies"]["default_policy"].items()]
    assert weights and all(torch.equal(newest["algorithm"]["policies"]["default_policy"][k], v) for k, v in weights)
    assert newest["config"]["learning_rate"] == move["params"]["learning_rate"]
    assert run_experiments(spec, tmp_path, sequential=True, verbose=1)
    record = json.loads((moved / "trial.json").read_text())
    assert record["exploits"][0] == move  # kept, not made again
    assert json.loads((moved / "result.json").read_text())["timesteps_total"] == 8192
    state, _ = ckpt.read_checkpoint(ckpt.resolve_checkpoint(moved))
    assert state["config"]["learning_rate"] == record["exploits"][-1]["params"]["learning_rate"]  # later ones keep it

    trials = {json.loads(p.read_text())["params"]["learning_rate"]: p.parent for p in tmp_path.glob("pop/*/trial.json")}
    learners = {trials[3e-3].name, trials[1e-3].name}
    for hopeless in (1e-12, 1e-13):
        first = json.loads((trials[hopeless] / "trial.json").read_text())["exploits"][0]
        assert first["timesteps_total"] == 2048 and first["from"] in learners
        assert first["params"]["learning_rate"] in (3e-3, 1e-3, 1e-12)  # a neighbour in the list of a learner's value
    assert "goes on from" in capsys.readouterr().err
    finals = {lr: json.loads((run / "result.json").read_text()) for lr, run in trials.items()}
    assert all(final["timesteps_total"] == 8192 for final in finals.values())
    last = {lr: final["metric_analysis"]["rollout/episode_reward_mean"]["last"] for lr, final in finals.items()}
    assert last[1e-12] > 40 and last[1e-13] > 40  # random play holds a pole about 21 steps
    assert "1 of 1 (1 went on from better trials)" in (tmp_path / "results.md").read_text()
    assert (
        len(list(tmp_path.glob(f"pop/*/{POINTS}/point_*"))) == 4
    )  # the last point's alone: every trial passed the others
    mtimes = {lr: (run / "result.json").stat().st_mtime_ns for lr, run in trials.items()}
    assert run_experiments(sweep(resample_probability=0.0), tmp_path, sequential=True, verbose=0)
    assert mtimes == {lr: (run / "result.json").stat().st_mtime_ns for lr, run in trials.items()}


def test_the_documented_example_is_a_valid_experiment():
    text = (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()
    block = text.split("```yaml\nlunarlander-pbt:")[1].split("```")[0]
    (experiment,) = load_experiments(yaml.safe_load("lunarlander-pbt:" + block))
    assert experiment.population == Population("episode_reward_mean", perturbation_interval=100000)
    assert [name for name, _ in experiment.spaces] == [("learning_rate",), ("ent_coef",)]


def test_a_gsde_trial_that_moves_to_a_donor_a_collection_behind_draws_its_next_collections_noise_anew(tmp_path):
    """gSDE's count of collections stays the moving trial's own, as its envs' carried noise
    matrices know it: taken from a donor one collection behind, the next collection would keep
    the matrices drawn with the trial's old std."""
    kw = dict(env="Pendulum-v1", use_sde=True, sde_sample_freq=-1, num_envs=2, rollout_fragment_length=32)
    kw |= dict(sgd_minibatch_size=32, tuned=False, kind_defaults=False, verbose=0)
    own = shoal.PPO(run_dir=str(tmp_path / "own"), seed=1, **kw)
    donor = shoal.PPO(run_dir=str(tmp_path / "donor"), seed=2, **kw)
    for _ in range(3):
        own.train()
    for _ in range(2):
        donor.train()
    own_point, donor_point = own.save(), donor.save()
    moved = shoal.PPO.from_checkpoint(own_point, run_dir=str(tmp_path / "own"))
    take_learned_state(moved, donor_point, own)
    (rows,) = moved.collector.policies.states
    held = rows["sde_noise"].clone()
    moved.train()
    assert not (rows["sde_noise"] == held).all(1).any()
