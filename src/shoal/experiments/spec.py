"""Experiment files: named experiments, each a config with search spaces, seeds and stop criteria
(RLlib's ``run_experiments`` format, in shoal's keys). Read by ``shoal.yaml_io``: safe and bounded.

    cartpole-lr:                        # the experiment's name
      algo: ppo                         # or `run`, RLlib's name for it
      env: CartPole-v1
      stop: {timesteps_total: 50000, episode_reward_mean: 475, time_total_s: 600}
      seeds: [1, 2]                     # every configuration once per seed
      num_samples: 1                    # draws of the random spaces per grid point
      checkpoint_freq: 10               # iterations between checkpoints (and one at the end)
      resources_per_trial: {cpu: 1}
      scheduler: {type: asha, metric: episode_reward_mean, grace_period: 20000}   # stop weak trials early
      # or population-based training: {type: pbt, metric: episode_reward_mean, perturbation_interval: 20000}
      # or, instead of scheduler: trials drawn one at a time by Optuna (num_samples of them)
      # search: {type: optuna, metric: episode_reward_mean, grace_period: 20000}
      config:                           # any key of the algorithm's config
        learning_rate: {grid_search: [0.0003, 0.001]}
        num_sgd_iter: {grid_search: [4, 10]}
        ent_coef: {uniform: [0.0, 0.01]}

A search space is a one-key mapping: ``grid_search`` (every value), ``choice`` (one at random),
``uniform``, ``loguniform`` (a float in ``[low, high]``) or ``randint`` (an int in ``[low, high)``),
at any depth of ``config`` (e.g. inside ``model_config``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shoal.errors import ConfigError, did_you_mean, shorten
from shoal.yaml_io import load_yaml

SPACES = ("grid_search", "choice", "uniform", "loguniform", "randint")
STOP_KEYS = ("timesteps_total", "training_iteration", "time_total_s", "episode_reward_mean", "episodes_total")
EXPERIMENT_KEYS = (
    "algo",
    "run",
    "env",
    "stop",
    "seeds",
    "num_samples",
    "checkpoint_freq",
    "resources_per_trial",
    "scheduler",
    "search",
    "config",
)
PROGRESS_KEYS = ("timesteps_total", "training_iteration", "time_total_s")  # what a scheduler's rungs count
SCHEDULER_KEYS = ("type", "metric", "mode", "grace_period", "reduction_factor", "time_attr")
POPULATION_KEYS = (
    "type",
    "metric",
    "mode",
    "perturbation_interval",
    "quantile_fraction",
    "resample_probability",
    "time_attr",
)
SEARCH_KEYS = ("type", "metric", "mode", "grace_period", "startup_trials", "time_attr")
Path_ = tuple[str, ...]  # where a search space sits in the config: ("model_config", "hiddens")


@dataclass
class Space:
    kind: str
    values: list[Any]  # grid_search / choice: the options; uniform, loguniform, randint: [low, high]

    def sample(self, rng: np.random.Generator) -> Any:
        if self.kind == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        low, high = self.values
        if self.kind == "uniform":
            return float(rng.uniform(low, high))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        return int(rng.integers(low, high))  # randint


@dataclass(frozen=True)
class Halving:
    """Asynchronous successive halving (ASHA, Li et al. 2020): at each rung, ``grace_period`` times
    a power of ``reduction_factor`` of ``time_attr``, a trial goes on only if its ``metric`` is in
    the best ``1 / reduction_factor`` of the values the trials that reached the rung before it had
    there; otherwise it stops (pruned)."""

    metric: str
    grace_period: float
    reduction_factor: float = 3.0
    time_attr: str = "timesteps_total"
    mode: str = "max"

    def rungs_passed(self, progress: float) -> list[float]:
        """The rungs at or below ``progress``, lowest first (rung ``k`` is ``grace_period * rf**k``)."""
        out: list[float] = []
        while (rung := self.grace_period * self.reduction_factor ** len(out)) <= progress:
            out.append(rung)
        return out


@dataclass(frozen=True)
class Population:
    """Population-based training (Jaderberg et al. 2017): at each multiple of
    ``perturbation_interval`` of ``time_attr``, a trial whose ``metric`` is in the worst
    ``quantile_fraction`` of those the trials had there takes the learned state of one in the best,
    and perturbs its values (``shoal.experiments.population``)."""

    metric: str
    perturbation_interval: float
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    time_attr: str = "timesteps_total"
    mode: str = "max"


@dataclass(frozen=True)
class Search:
    """Trials drawn one at a time by Optuna's TPE sampler from what the earlier ones reached, the
    first ``startup_trials`` at random; from ``startup_trials`` trials on, a trial stops (pruned) at a
    multiple of ``grace_period`` of ``time_attr`` where its ``metric`` is worse than the median the
    earlier trials had there (Optuna's median pruner)."""

    metric: str
    grace_period: float
    startup_trials: int = 5
    time_attr: str = "timesteps_total"
    mode: str = "max"


@dataclass
class Experiment:
    name: str
    settings: dict[str, Any]
    """``algo``, ``env`` and the config, with ``Space`` leaves where a search space was given."""
    stop: dict[str, float]
    seeds: list[int]
    num_samples: int = 1
    checkpoint_freq: int = 10
    cpus_per_trial: float = 1.0
    halving: Halving | None = None
    """``scheduler: {type: asha, ...}``: stop trials early whose metric falls behind."""
    population: Population | None = None
    """``scheduler: {type: pbt, ...}``: trials that fall behind train on from the best ones' state."""
    search: Search | None = None
    """``search: {type: optuna, ...}``: ``num_samples`` trials drawn one by one, not planned up front."""

    @property
    def spaces(self) -> list[tuple[Path_, Space]]:
        """Every search space of the config, in the file's order."""
        return list(_spaces(self.settings, ()))


@dataclass
class Trial:
    """One configuration of an experiment with one seed."""

    experiment: str
    name: str
    params: dict[str, Any]
    """The searched values (``model_config.hiddens`` for nested keys) and the seed."""
    settings: dict[str, Any]
    """The whole config to train with."""


def _spaces(node: Any, path: Path_) -> Any:
    if isinstance(node, Space):
        yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _spaces(value, (*path, key))


def with_values(settings: dict[str, Any], values: dict[Path_, Any]) -> dict[str, Any]:
    """A copy of ``settings`` with the value at each path replaced."""
    out: dict[str, Any] = _copy(settings)
    for path, value in values.items():
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return out


def _copy(node: Any) -> Any:
    return {k: _copy(v) for k, v in node.items()} if isinstance(node, dict) else node


def param_name(path: Path_) -> str:
    return ".".join(path)


def trials(experiment: Experiment) -> list[Trial]:
    """The trials run one after another without Tune, in Tune's order: ``num_samples`` times the
    grid (random spaces drawn anew each time), each grid point once per seed. The draws depend on
    the experiment's name alone, so a restarted sweep gets the same trials."""
    spaces = experiment.spaces
    grid = [(path, space) for path, space in spaces if space.kind == "grid_search"]
    drawn = [(path, space) for path, space in spaces if space.kind != "grid_search"]
    rng = np.random.default_rng(zlib.crc32(experiment.name.encode()))
    out: list[Trial] = []
    for sample in range(experiment.num_samples):
        for point in itertools.product(*(space.values for _, space in grid)):
            values = {path: value for (path, _), value in zip(grid, point)}
            values |= {path: space.sample(rng) for path, space in drawn}
            out += [make_trial(experiment, values, seed, sample) for seed in experiment.seeds]
    return out


def make_trial(experiment: Experiment, values: dict[Path_, Any], seed: int, sample: int = 0) -> Trial:
    """The trial of ``experiment`` with the searched ``values`` and ``seed``. Its directory name
    comes from its values: an edited file never gives an old name to new values."""
    params = {param_name(path): value for path, value in values.items()} | {"seed": seed}
    digest = hashlib.sha1(json.dumps([sample, params], sort_keys=True, default=str).encode()).hexdigest()
    settings = with_values(experiment.settings, values) | {"seed": seed}
    return Trial(experiment.name, f"trial_{digest[:10]}", params, settings)


# ----- reading and checking a file -------------------------------------------------------------
def load_experiments(source: str | Path | dict[str, Any]) -> list[Experiment]:
    """The experiments of a YAML file (or of the same mapping in Python), every key and every value
    of every search space checked against the algorithm's config before anything runs."""
    data = source if isinstance(source, dict) else load_yaml(source)
    where = "the experiments" if isinstance(source, dict) else f"'{source}'"
    if not data:
        raise ConfigError(f"{where} holds no experiments: a mapping of name -> experiment.")
    return [_experiment(str(name), spec, where) for name, spec in data.items()]


def _experiment(name: str, spec: Any, where: str) -> Experiment:
    at = f"{where}, experiment '{shorten(name)}'"
    if not re.fullmatch(r"[\w.-]+", name):
        raise ConfigError(f"{at}: a name is one word of letters, digits, '.', '-' and '_' (it names a directory).")
    if not isinstance(spec, dict):
        raise ConfigError(f"{at} must be a mapping with algo, env, stop and config, got {shorten(repr(spec))}.")
    for key in spec:
        if key not in EXPERIMENT_KEYS:
            raise ConfigError(f"{at}: unknown key '{shorten(str(key))}'.{did_you_mean(str(key), EXPERIMENT_KEYS)}")
    if "algo" in spec and "run" in spec:
        raise ConfigError(f"{at}: `algo` and `run` name the same thing; give one.")
    if "env" not in spec or not {"algo", "run"} & spec.keys():
        raise ConfigError(f"{at} needs `algo` (or `run`) and `env`.")
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{at}: config must be a mapping of key: value or search space, got {shorten(repr(config))}.")
    for key in config:
        if not isinstance(key, str):  # they become keyword arguments
            raise ConfigError(f"{at}: a config key is a name, got {shorten(repr(key))}.")
    settings = {"algo": spec.get("algo", spec.get("run")), "env": spec["env"]}
    for key in ("algo", "env", "seed"):
        if key in config:
            raise ConfigError(f"{at}: give `{key}` beside config (`seeds` for seeds), not inside it.")
    settings |= {key: _parse(value, f"{at}, config.{shorten(str(key))}") for key, value in config.items()}
    stop = spec.get("stop") or {}
    if not isinstance(stop, dict) or not stop:
        raise ConfigError(f"{at}: stop must be a mapping of criteria, e.g. {{timesteps_total: 100000}}.")
    for key, value in stop.items():
        if key not in STOP_KEYS:
            raise ConfigError(f"{at}: unknown stop criterion '{shorten(str(key))}'.{did_you_mean(str(key), STOP_KEYS)}")
        if not _number(value):
            raise ConfigError(f"{at}: stop.{key} must be a number, got {shorten(repr(value))}.")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and s >= 0 for s in seeds):
        raise ConfigError(f"{at}: seeds must be a list of non-negative integers, got {shorten(repr(seeds))}.")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{at}: seeds {shorten(str(seeds))} repeat a seed.")
    counts = {key: spec.get(key, default) for key, default in (("num_samples", 1), ("checkpoint_freq", 10))}
    for key, value in counts.items():
        if type(value) is not int or value < (1 if key == "num_samples" else 0):
            raise ConfigError(
                f"{at}: {key} must be an integer >= {1 if key == 'num_samples' else 0}, got {shorten(repr(value))}."
            )
    resources = spec.get("resources_per_trial") or {"cpu": 1}
    if (
        not isinstance(resources, dict)
        or set(resources) != {"cpu"}
        or not _number(resources["cpu"])
        or resources["cpu"] <= 0
    ):
        raise ConfigError(f"{at}: resources_per_trial must be {{cpu: N}} with N > 0, got {shorten(repr(resources))}.")
    experiment = Experiment(
        name,
        settings,
        dict(stop),
        seeds,
        counts["num_samples"],
        counts["checkpoint_freq"],
        float(resources["cpu"]),
        *_scheduler(spec.get("scheduler"), at),
        search=_search(spec.get("search"), at),
    )
    if experiment.search is not None:
        _check_search(experiment, at)
    if experiment.population is not None:
        _check_population(experiment, at)
    _check_config(experiment, at)
    return experiment


def _scheduler(spec: Any, at: str) -> tuple[Halving | None, Population | None]:
    """The ``scheduler`` mapping, checked: ``type`` ``asha`` (with ``grace_period``) or ``pbt``
    (with ``perturbation_interval``), and ``metric``."""
    if spec is None:
        return None, None
    if isinstance(spec, dict) and spec.get("type") == "pbt":
        common = _judge_keys("scheduler", spec, POPULATION_KEYS, "pbt", at, first="perturbation_interval")
        fractions = {key: spec.get(key, 0.25) for key in ("quantile_fraction", "resample_probability")}
        for key, value in fractions.items():
            limit = 0.5 if key == "quantile_fraction" else 1.0
            if not _number(value) or not 0 <= value <= limit:
                raise ConfigError(
                    f"{at}: scheduler.{key} must be a number in [0, {limit}], got {shorten(repr(value))}."
                )
        population = Population(
            common["metric"],
            common["perturbation_interval"],
            fractions["quantile_fraction"],
            fractions["resample_probability"],
            common["time_attr"],
            common["mode"],
        )
        return None, population
    common = _judge_keys("scheduler", spec, SCHEDULER_KEYS, "asha", at, kinds=("asha", "pbt"))
    rf = spec.get("reduction_factor", 3.0)
    _positive("scheduler", "reduction_factor", rf, at, above=1)
    return Halving(common["metric"], common["grace_period"], rf, common["time_attr"], common["mode"]), None


def _search(spec: Any, at: str) -> Search | None:
    """The ``search`` mapping, checked: ``type: optuna``, ``metric`` and ``grace_period`` required."""
    if spec is None:
        return None
    common = _judge_keys("search", spec, SEARCH_KEYS, "optuna", at)
    startup = spec.get("startup_trials", 5)
    if type(startup) is not int or startup < 0:
        raise ConfigError(f"{at}: search.startup_trials must be an integer >= 0, got {shorten(repr(startup))}.")
    return Search(common["metric"], common["grace_period"], startup, common["time_attr"], common["mode"])


def _judge_keys(
    block: str,
    spec: Any,
    allowed: tuple[str, ...],
    kind: str,
    at: str,
    first: str = "grace_period",
    kinds: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """What the schedulers and the search share, checked: their keys, ``type`` (one of ``kinds``,
    default ``kind``), ``metric``, ``first`` (where trials are first judged), ``time_attr`` and
    ``mode``."""
    kinds = kinds or (kind,)
    if not isinstance(spec, dict):
        raise ConfigError(f"{at}: {block} must be a mapping such as {{type: {kind}, metric: ..., {first}: ...}}.")
    if spec.get("type") not in kinds:
        expected = f"the one type is '{kind}'" if len(kinds) == 1 else "one of " + ", ".join(f"'{k}'" for k in kinds)
        raise ConfigError(f"{at}: {block} type {shorten(repr(spec.get('type')))}: {expected}.")
    for key in spec:
        if key not in allowed:
            raise ConfigError(f"{at}: unknown {block} key '{shorten(str(key))}'.{did_you_mean(str(key), allowed)}")
    metric = spec.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"{at}: {block}.metric names a result key, e.g. episode_reward_mean.")
    if first not in spec:
        raise ConfigError(f"{at}: {block}.{first} is required: where trials are first judged, in time_attr.")
    _positive(block, first, spec[first], at)
    common = {
        "metric": metric,
        first: spec[first],
        "time_attr": spec.get("time_attr", "timesteps_total"),
        "mode": spec.get("mode", "max"),
    }
    if common["time_attr"] not in PROGRESS_KEYS:
        raise ConfigError(
            f"{at}: {block}.time_attr {shorten(repr(common['time_attr']))}: one of {', '.join(PROGRESS_KEYS)}."
        )
    if common["mode"] not in ("max", "min"):
        raise ConfigError(f"{at}: {block}.mode {shorten(repr(common['mode']))}: 'max' or 'min'.")
    return common


def _positive(block: str, key: str, value: Any, at: str, above: float = 0) -> None:
    if isinstance(value, str):  # YAML reads 1e6 as a string: a float needs its dot
        raise ConfigError(f"{at}: {block}.{key} {shorten(repr(value))} is text; write 1.0e6 or 1000000.")
    if not _number(value) or value <= above:
        raise ConfigError(f"{at}: {block}.{key} must be a number > {above:g}, got {shorten(repr(value))}.")


def _check_population(experiment: Experiment, at: str) -> None:
    """What population-based training takes: values to perturb, none of which changes the shapes of
    the networks (a trial loads another's weights)."""
    if not experiment.spaces:
        raise ConfigError(f"{at}: scheduler type 'pbt' perturbs the searched values: give config a search space.")
    for path, _ in experiment.spaces:
        if {"model", "model_config", "env", "normalize_obs"} & set(path):
            raise ConfigError(
                f"{at}, config.{param_name(path)}: population-based training cannot search it: a trial takes "
                f"another's learned state, so every trial's networks and statistics must have the same shapes."
            )


def _check_search(experiment: Experiment, at: str) -> None:
    """What Optuna's search takes: no scheduler beside it (it prunes by itself), one seed per trial,
    and choices of values it can store."""
    if experiment.halving is not None or experiment.population is not None:
        raise ConfigError(
            f"{at}: search: optuna judges its trials itself (median rule), so it takes no scheduler; give "
            f"scheduler or search."
        )
    if len(experiment.seeds) != 1:
        raise ConfigError(
            f"{at}: search: optuna runs one seed per trial, got seeds {shorten(str(experiment.seeds))}; "
            f"run the best values again with more seeds in a second experiment."
        )
    for path, space in experiment.spaces:
        if space.kind in ("grid_search", "choice"):
            for value in space.values:
                if value is not None and not isinstance(value, (bool, int, float, str)):
                    raise ConfigError(
                        f"{at}, config.{param_name(path)}: Optuna chooses among numbers, text, booleans and null, "
                        f"got {shorten(repr(value))}."
                    )


def _parse(value: Any, at: str) -> Any:
    """A config value, with one-key mappings of a space kind turned into ``Space``."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SPACES:
        kind, options = next(iter(value.items()))
        if not isinstance(options, list) or not options:
            raise ConfigError(f"{at}: {kind} takes a non-empty list, got {shorten(repr(options))}.")
        if kind in ("uniform", "loguniform", "randint"):
            ok = len(options) == 2 and all(_number(o) for o in options) and options[0] < options[1]
            if not ok or (kind == "loguniform" and options[0] <= 0):
                raise ConfigError(
                    f"{at}: {kind} takes [low, high] with low < high{' and low > 0' * (kind == 'loguniform')}, "
                    f"got {shorten(repr(options))}."
                )
        return Space(kind, options)
    if isinstance(value, dict):
        return {k: _parse(v, f"{at}.{shorten(str(k))}") for k, v in value.items()}
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_config(experiment: Experiment, at: str) -> None:
    """Build the algorithm's config with each option of each space in turn (the others at their
    first option), so a typo or a bad value fails now, naming the key, not hours into a sweep."""
    from shoal.algos.registry import algorithm_class

    config_class = algorithm_class(experiment.settings["algo"]).config_class
    spaces = experiment.spaces
    first = {path: space.values[0] for path, space in spaces}
    variants = [first] + [first | {path: option} for path, space in spaces for option in _options(space)]
    for values in variants:
        try:
            config_class.build(**with_values(experiment.settings, values))
        except ConfigError as e:
            raise ConfigError(f"{at}: {e}") from None


def _options(space: Space) -> list[Any]:
    """The values a space can take that a check should try: all of a list, both ends of a range."""
    if space.kind in ("grid_search", "choice"):
        return space.values[1:]
    low, high = space.values
    return [high - 1 if space.kind == "randint" else high, low]
