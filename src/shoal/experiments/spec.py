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
    "config",
)
PROGRESS_KEYS = ("timesteps_total", "training_iteration", "time_total_s")  # what a scheduler's rungs count
SCHEDULER_KEYS = ("type", "metric", "mode", "grace_period", "reduction_factor", "time_attr")
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
            for seed in experiment.seeds:
                params = {param_name(path): value for path, value in values.items()} | {"seed": seed}
                settings = with_values(experiment.settings, values) | {"seed": seed}
                out.append(Trial(experiment.name, _name(params, sample), params, settings))
    return out


def _name(params: dict[str, Any], sample: int) -> str:
    """A trial's directory name, from its values: an edited file never gives an old name to new values."""
    digest = hashlib.sha1(json.dumps([sample, params], sort_keys=True, default=str).encode()).hexdigest()
    return f"trial_{digest[:10]}"


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
        _halving(spec.get("scheduler"), at),
    )
    _check_config(experiment, at)
    return experiment


def _halving(spec: Any, at: str) -> Halving | None:
    """The ``scheduler`` mapping, checked: ``type: asha`` and ``metric`` required."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"{at}: scheduler must be a mapping such as {{type: asha, metric: ..., grace_period: ...}}.")
    for key in spec:
        if key not in SCHEDULER_KEYS:
            raise ConfigError(
                f"{at}: unknown scheduler key '{shorten(str(key))}'.{did_you_mean(str(key), SCHEDULER_KEYS)}"
            )
    if spec.get("type") != "asha":
        raise ConfigError(f"{at}: scheduler type {shorten(repr(spec.get('type')))}: the one type is 'asha'.")
    metric = spec.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"{at}: scheduler.metric names a result key, e.g. episode_reward_mean.")
    halving = Halving(
        metric,
        spec.get("grace_period", 0),
        spec.get("reduction_factor", 3.0),
        spec.get("time_attr", "timesteps_total"),
        spec.get("mode", "max"),
    )
    if "grace_period" not in spec:
        raise ConfigError(f"{at}: scheduler.grace_period is required: the first rung, in its time_attr.")
    for key in ("grace_period", "reduction_factor"):
        if isinstance(spec.get(key), str):  # YAML reads 1e6 as a string: a float needs its dot
            raise ConfigError(f"{at}: scheduler.{key} {shorten(repr(spec[key]))} is text; write 1.0e6 or 1000000.")
    if not _number(halving.grace_period) or halving.grace_period <= 0:
        raise ConfigError(
            f"{at}: scheduler.grace_period must be a number > 0, got {shorten(repr(halving.grace_period))}."
        )
    if not _number(halving.reduction_factor) or halving.reduction_factor <= 1:
        raise ConfigError(
            f"{at}: scheduler.reduction_factor must be a number > 1, got {shorten(repr(halving.reduction_factor))}."
        )
    if halving.time_attr not in PROGRESS_KEYS:
        raise ConfigError(
            f"{at}: scheduler.time_attr {shorten(repr(halving.time_attr))}: one of {', '.join(PROGRESS_KEYS)}."
        )
    if halving.mode not in ("max", "min"):
        raise ConfigError(f"{at}: scheduler.mode {shorten(repr(halving.mode))}: 'max' or 'min'.")
    return halving


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
