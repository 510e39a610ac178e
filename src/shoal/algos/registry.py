"""``algo=``: an algorithm's short name, an ``Algorithm`` subclass, or ``'package.module:Class'``."""

from __future__ import annotations

from typing import Any

from shoal.algos.base import Algorithm
from shoal.algos.bc import BCAlgorithm
from shoal.algos.cql import CQLAlgorithm
from shoal.algos.dqn import DQNAlgorithm
from shoal.algos.grpo import GRPOAlgorithm
from shoal.algos.maddpg import MADDPGAlgorithm
from shoal.algos.marwil import MARWILAlgorithm
from shoal.algos.ppo import PPOAlgorithm
from shoal.algos.pqn import PQNAlgorithm
from shoal.algos.sac import SACAlgorithm
from shoal.algos.td3 import TD3Algorithm
from shoal.errors import ConfigError, did_you_mean, shorten
from shoal.imports import import_spec, is_spec, spec_of

ALGORITHMS: dict[str, type[Algorithm[Any, Any]]] = {
    "ppo": PPOAlgorithm,
    "grpo": GRPOAlgorithm,
    "dqn": DQNAlgorithm,
    "pqn": PQNAlgorithm,
    "sac": SACAlgorithm,
    "td3": TD3Algorithm,
    "maddpg": MADDPGAlgorithm,
    "bc": BCAlgorithm,
    "marwil": MARWILAlgorithm,
    "cql": CQLAlgorithm,
}


def register_algorithm(name: str, cls: type[Algorithm[Any, Any]]) -> None:
    """Make ``algo=name`` (config, command line) build ``cls``."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"register_algorithm('{name}', ...) needs a shoal.Algorithm subclass, got {cls!r}.")
    ALGORITHMS[name.lower()] = cls


def algorithm_class(spec: Any) -> type[Algorithm[Any, Any]]:
    """The Algorithm subclass ``spec`` names."""
    if isinstance(spec, type) and issubclass(spec, Algorithm):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(
            f"algo must be an algorithm name ({', '.join(ALGORITHMS)}), a shoal.Algorithm subclass "
            f"or 'package.module:Class', got {shorten(repr(spec))}."
        )
    if spec.lower() in ALGORITHMS:
        return ALGORITHMS[spec.lower()]
    if not is_spec(spec):
        raise ConfigError(
            f"unknown algo {shorten(repr(spec))}.{did_you_mean(spec.lower(), ALGORITHMS)} Known: "
            f"{', '.join(ALGORITHMS)}; an algorithm of your own is given as a shoal.Algorithm "
            f"subclass or 'package.module:Class'."
        )
    return algorithm_class(import_spec(spec, "algo"))


def algorithm_spec(cls: type[Algorithm[Any, Any]]) -> str:
    """What ``algo`` is written as in config.yaml and checkpoints: a built-in algorithm's short
    name, else 'module:Class', which a new process can import again (a name given with
    ``register_algorithm`` exists only in the process that registered it)."""
    for name, known in ALGORITHMS.items():
        if known is cls and cls.__module__.startswith("shoal."):
            return name
    return spec_of(cls)
