"""Experiment files: search spaces expanded and checked before anything runs, trials run one after
another or on Ray Tune, an interrupted sweep resumed, and the results table and plot."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from shoal.cli import main
from shoal.errors import ConfigError
from shoal.experiments import load_experiments, run_experiments, trials
from shoal.experiments.run import stop_reached
from shoal.train.callbacks import Callback


def grid(**extra):
    """The acceptance sweep: learning_rate x num_sgd_iter, 2 seeds, a short budget."""
    return {
        "cartpole": {
            "algo": "ppo",
            "env": "CartPole-v1",
            "stop": {"timesteps_total": 2048},
            "seeds": [1, 2],
            "checkpoint_freq": 1,
            "config": {
                "learning_rate": {"grid_search": [3e-4, 1e-3]},
                "num_sgd_iter": {"grid_search": [2, 4]},
                "num_envs": 4,
                "rollout_fragment_length": 128,
                "sgd_minibatch_size": 128,
                **extra,
            },
        }
    }


class Interrupt(Callback):
    """Sends SIGINT to process ``pid`` (Ctrl-C) once, at iteration 2 of the trial with ``seed`` and
    ``learning_rate``: ``marker`` is created by whoever sends it."""

    def __init__(self, pid, marker, seed=2, learning_rate=1e-3):
        self.pid, self.marker, self.seed, self.learning_rate = pid, marker, seed, learning_rate

    def on_train_result(self, trainer, result):
        c = trainer.config
        if trainer.iteration == 2 and c.seed == self.seed and c.learning_rate == self.learning_rate:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return None
            os.kill(self.pid, signal.SIGINT)
        return None


class Explode(Callback):
    """Raises in the trial with ``seed`` and ``learning_rate``, as a bug in a user's callback would."""

    def __init__(self, seed=1, learning_rate=3e-4):
        self.seed, self.learning_rate = seed, learning_rate

    def on_train_result(self, trainer, result):
        c = trainer.config
        if c.seed == self.seed and c.learning_rate == self.learning_rate and c.num_sgd_iter == 2:
            raise RuntimeError("a bug in a callback")


# ----- the file ---------------------------------------------------------------------------------
def test_a_grid_with_seeds_expands_to_every_combination_once_per_seed():
    (experiment,) = load_experiments(grid())
    planned = trials(experiment)
    assert len(planned) == 8
    assert {(t.params["learning_rate"], t.params["num_sgd_iter"], t.params["seed"]) for t in planned} == {
        (lr, n, s) for lr in (3e-4, 1e-3) for n in (2, 4) for s in (1, 2)
    }
    assert planned[0].settings["num_envs"] == 4 and planned[0].settings["algo"] == "ppo"


def test_random_spaces_are_drawn_per_sample_within_their_range_and_alike_on_every_restart():
    spec = grid(ent_coef={"uniform": [0.0, 0.01]}, clip_coef={"choice": [0.1, 0.2, 0.3]})
    spec["cartpole"]["num_samples"] = 3
    (experiment,) = load_experiments(spec)
    planned = trials(experiment)
    assert len(planned) == 3 * 8
    assert all(0.0 <= t.params["ent_coef"] <= 0.01 and t.params["clip_coef"] in (0.1, 0.2, 0.3) for t in planned)
    assert len({t.params["ent_coef"] for t in planned}) == 3 * 4  # drawn anew for every grid point and sample
    assert [t.params for t in planned] == [t.params for t in trials(experiment)]


def test_nested_keys_can_be_searched():
    (experiment,) = load_experiments(grid(model_config={"hiddens": {"grid_search": [[32], [64, 64]]}}))
    planned = trials(experiment)
    assert {tuple(t.params["model_config.hiddens"]) for t in planned} == {(32,), (64, 64)}
    assert planned[0].settings["model_config"]["hiddens"] in ([32], [64, 64])


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(stpo={"timesteps_total": 1}), "unknown key 'stpo'. Did you mean 'stop'"),
        (dict(stop={"episode_reward_men": 1}), "unknown stop criterion 'episode_reward_men'.*episode_reward_mean"),
        (dict(stop={}), "stop must be a mapping of criteria"),
        (dict(seeds=[1, 1]), r"seeds \[1, 1\] repeat a seed"),
        (dict(seeds="1"), "seeds must be a list"),
        (dict(num_samples=0), "num_samples must be an integer >= 1"),
        (dict(resources_per_trial={"gpu": 1}), "resources_per_trial must be"),
        (dict(algo="ppo", run="dqn"), "`algo` and `run` name the same thing"),
    ],
)
def test_bad_experiment_keys_are_named(change, message):
    spec = grid()
    spec["cartpole"] |= change
    with pytest.raises(ConfigError, match=f"experiment 'cartpole': {message}"):
        load_experiments(spec)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"learing_rate": 1e-3}, "learing_rate.*Did you mean 'learning_rate'"),
        ({"num_sgd_iter": {"grid_search": [4, 0]}}, "num_sgd_iter"),  # the second option is bad: tried too
        ({"ent_coef": {"uniform": [0.1]}}, r"uniform takes \[low, high\]"),
        ({"learning_rate": {"loguniform": [0, 1]}}, "low > 0"),
        ({"seed": 3}, "give `seed` beside config"),
    ],
)
def test_bad_config_values_fail_before_any_trial_runs(config, message):
    spec = grid()
    spec["cartpole"]["config"] = config
    with pytest.raises(ConfigError, match=message):
        load_experiments(spec)


def test_a_file_is_read_with_safe_load(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_experiments(path)


def test_any_criterion_ends_a_trial():
    stop = {"timesteps_total": 1000, "episode_reward_mean": 475}
    assert not stop_reached({"timesteps_total": 512, "episode_reward_mean": 100}, stop)
    assert stop_reached({"timesteps_total": 512, "episode_reward_mean": 480}, stop)
    assert stop_reached({"timesteps_total": 1024, "episode_reward_mean": float("nan")}, stop)


# ----- running ----------------------------------------------------------------------------------
def _finished(out):
    done = {}
    for record in (out / "cartpole").glob("*/result.json"):
        if json.loads(record.read_text()).get("stop_reason") not in ("SIGINT", "SIGTERM"):
            done[record.parent.name] = len((record.parent / "metrics.jsonl").read_text().splitlines())
    return done


def _check_results(out):
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 0.")]
    assert len(rows) == 4 and all("| 2 of 2 | 2,048 |" in row for row in rows)
    assert (out / "cartpole.png").stat().st_size > 10_000


@pytest.mark.slow
def test_sequential_sweep_interrupted_then_resumed_by_the_same_command(tmp_path, capsys):
    out = tmp_path / "sweep"
    marker = tmp_path / "interrupted"
    spec = grid(callbacks=[Interrupt(os.getpid(), str(marker))])
    assert not run_experiments(spec, out, sequential=True, verbose=0)
    assert marker.exists()
    before = _finished(out)
    assert 0 < len(before) < 8  # the trials before the interrupted one, not those after it
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(grid()))  # JSON is YAML
    assert main(["tune", str(path), "--out", str(out), "--sequential"]) == 0
    after = _finished(out)
    assert len(after) == 8 and all(after[name] == lines for name, lines in before.items())  # not run again
    _check_results(out)
    assert "| learning_rate | num_sgd_iter | seeds finished |" in capsys.readouterr().out


@pytest.mark.slow
def test_a_sweep_on_tune_writes_its_table_and_plot_and_resumes_after_an_interrupt(ray_cluster, tmp_path):
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the trials unpickle Interrupt
    out = tmp_path / "sweep"
    marker = tmp_path / "interrupted"
    spec = grid(callbacks=[Interrupt(os.getpid(), str(marker))])  # Ctrl-C to this process, the driver
    assert not run_experiments(spec, out, sequential=False, verbose=0)
    assert marker.exists()
    before = _finished(out)
    assert len(before) < 8
    assert run_experiments(spec, out, sequential=False, verbose=0)  # the same call: Tune restores the sweep
    (experiment,) = load_experiments(spec)
    planned = {t.name: t.params for t in trials(experiment)}  # the same trials, drawn alike, as without Tune
    ran = {p.parent.name: json.loads(p.read_text())["params"] for p in (out / "cartpole").glob("*/trial.json")}
    assert ran == planned
    after = _finished(out)
    assert len(after) == 8 and all(after[name] == lines for name, lines in before.items())
    _check_results(out)
    assert (out / "tune" / "cartpole").is_dir()


def test_a_trial_tune_restores_after_it_finished_is_not_run_again(tmp_path, monkeypatch):
    # Tune saves a sweep's state now and then: an interrupt just after a trial's end can leave it
    # unfinished in that state, and the restore starts it again.
    pytest.importorskip("ray.tune")
    import shoal.experiments.run as run

    (experiment,) = load_experiments(grid())
    planned = trials(experiment)
    ran = []
    monkeypatch.setattr(run, "run_trial", lambda trial, *args, **kwargs: ran.append(trial.name))
    done, unfinished = (tmp_path / "cartpole" / t.name for t in planned[:2])
    done.mkdir(parents=True)
    (done / "result.json").write_text(json.dumps({"stop_reason": None}))
    for trial in planned[:2]:
        run._tune_trial({"trial": trial.name}, experiment, planned, str(tmp_path))
    assert ran == [unfinished.name]


@pytest.mark.slow
def test_a_failing_trial_is_reported_and_the_others_still_run(tmp_path, capsys):
    assert not run_experiments(grid(callbacks=[Explode()]), tmp_path, sequential=True, verbose=0)
    assert len(_finished(tmp_path)) == 7
    (error,) = (tmp_path / "cartpole").glob("*/error.txt")
    assert "RuntimeError: a bug in a callback" in error.read_text()
    assert "failed: a bug in a callback" in capsys.readouterr().err
    assert "| 1 of 2 |" in (tmp_path / "results.md").read_text()


def test_without_tune_trials_run_one_at_a_time_and_say_so(tmp_path, monkeypatch, capsys):
    import shoal.experiments as experiments

    monkeypatch.setattr(experiments, "tune_installed", lambda: False)
    spec = grid()
    spec["cartpole"]["seeds"] = [1]
    spec["cartpole"]["config"] |= {"learning_rate": 1e-3, "num_sgd_iter": 2}
    spec["cartpole"]["stop"] = {"training_iteration": 1}
    assert run_experiments(spec, tmp_path, verbose=1)
    assert "Ray Tune is not installed" in capsys.readouterr().err
    assert (tmp_path / "results.md").is_file()


def test_the_example_sweep_file_is_valid():
    (experiment,) = load_experiments(Path(__file__).parent.parent / "examples" / "sweep.yaml")
    assert len(trials(experiment)) == 8 and experiment.stop["episode_reward_mean"] == 475


def test_the_documented_experiments_file_is_the_example():
    text = (Path(__file__).parent.parent / "docs" / "scaling.md").read_text()
    block = text.split("```yaml\ncartpole-lr-epochs:")[1].split("```")[0]
    example = Path(__file__).parent.parent / "examples" / "sweep.yaml"
    assert yaml.safe_load("cartpole-lr-epochs:" + block) == yaml.safe_load(example.read_text())
