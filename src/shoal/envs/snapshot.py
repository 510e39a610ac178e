"""Environment state as plain data, so a checkpoint can resume episodes exactly where they were.

Gymnasium has no get/set-state API, and pickling envs would make checkpoints run code when loaded.
Most Python envs (all of classic control and toy text) keep their whole state in plain attributes:
numbers, numpy arrays and numpy random generators. ``env_state`` walks the wrapper chain and
records those attributes; ``load_env_state`` puts them back. If any attribute holds something
else (a Box2D world, MuJoCo data, a subprocess), the snapshot is marked inexact and the trainer
resets those envs on resume instead of restoring half a state.

The encoded form holds only dicts, lists, tuples, str, numbers, None and torch tensors, which
``torch.load(weights_only=True)`` reads without unpickling code.
"""

from __future__ import annotations

import types
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.envs.horizon import EpisodeRules

_STATIC = (
    EpisodeRules,  # configuration (horizons): a resumed run takes its own config's
    gym.Space,
    gym.envs.registration.EnvSpec,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    type,
)
_CONSTRUCTOR_ARGS = "_saved_kwargs"  # a wrapper's constructor arguments (may name the env itself)


class _Inexact(Exception):
    """An attribute holds state that is not plain data."""


def encode(value: Any) -> Any:
    """Plain data -> a structure of tensors and builtins; raises _Inexact on anything else."""
    if isinstance(value, np.generic):  # before the builtins: np.float64 is a float, yet pickles as numpy
        return {"__npscalar__": value.dtype.str, "value": value.item()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise _Inexact
        raw = torch.from_numpy(np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8).copy())
        return {"__ndarray__": value.dtype.str, "shape": list(value.shape), "bytes": raw}
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, np.random.RandomState):
        return {"__randomstate__": encode(value.get_state())}
    if isinstance(value, tuple):
        return tuple(encode(v) for v in value)
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, (str, int)) for k in value):
        return {"__dict__": [(k, encode(v)) for k, v in value.items()]}
    raise _Inexact


def decode(value: Any, current: Any = None) -> Any:
    """Inverse of ``encode``. Random generators are restored into ``current`` when it is one, so
    other references to the same generator see the restored state too."""
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__ndarray__" in value:
        return (
            np.frombuffer(value["bytes"].numpy().tobytes(), np.dtype(value["__ndarray__"]))
            .reshape(value["shape"])
            .copy()
        )
    if "__npscalar__" in value:
        return np.dtype(value["__npscalar__"]).type(value["value"])
    if "__generator__" in value:
        state = value["__generator__"]
        gen = (
            current
            if isinstance(current, np.random.Generator)
            else np.random.Generator(getattr(np.random, state["bit_generator"])())
        )
        gen.bit_generator.state = state
        return gen
    if "__randomstate__" in value:
        rs = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        rs.set_state(decode(value["__randomstate__"]))
        return rs
    return {k: decode(v) for k, v in value["__dict__"]}


def _layers(env: Any) -> list[Any]:
    """The env and every env it wraps, outermost first."""
    layers = [env]
    while isinstance(getattr(layers[-1], "env", None), (gym.Env, gym.vector.VectorEnv)):
        layers.append(layers[-1].env)
    return layers


def env_state(env: Any) -> dict[str, Any]:
    """``{"exact": bool, "layers": [...]}``: every plain attribute of every wrapper layer."""
    layers = []
    for layer in _layers(env):
        attrs = []
        for key, value in vars(layer).items():
            if key == _CONSTRUCTOR_ARGS or isinstance(value, (gym.Env, gym.vector.VectorEnv, *_STATIC)):
                continue  # the wrapped env is its own layer; spaces, specs and functions never change
            try:
                attrs.append((key, encode(value)))
            except _Inexact:
                return {
                    "exact": False,
                    "layers": [],
                    "reason": f"{type(layer).__name__}.{key} is a {type(value).__name__}",
                }
        layers.append({"type": type(layer).__name__, "attrs": attrs})
    return {"exact": True, "layers": layers, "reason": ""}


def fits(env: Any, state: dict[str, Any]) -> bool:
    """Whether ``env`` has the wrapper chain ``state`` was recorded from."""
    return [type(x).__name__ for x in _layers(env)] == [s["type"] for s in state["layers"]]


def load_env_state(env: Any, state: dict[str, Any]) -> None:
    """Restore what ``env_state`` recorded into an env built the same way."""
    layers = _layers(env)
    saved = state["layers"]
    if [type(x).__name__ for x in layers] != [s["type"] for s in saved]:
        raise ValueError(
            f"env wrappers {[type(x).__name__ for x in layers]} differ from the saved {[s['type'] for s in saved]}"
        )
    for layer, entry in zip(layers, saved):
        for key, value in entry["attrs"]:
            setattr(layer, key, decode(value, getattr(layer, key, None)))
