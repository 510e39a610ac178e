"""The policy server's wire format: JSON over HTTP, version 1 (docs/serving.md describes it).

Observations and actions travel as plain JSON values shaped like the env's spaces (a Box as
nested lists, a Discrete as an int, a Dict as an object, a Tuple as a list), or, for large arrays,
as a typed array ``{"dtype": "uint8", "shape": [84, 84, 4], "data": "<base64 of the C-order
bytes>"}``. Nothing is ever unpickled or evaluated: every value is checked against its space here,
and what does not fit is a ``RequestError`` (HTTP 400) naming the field, what came and what fits.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import EnvError, RequestError

PROTOCOL_VERSION = 1
MAX_REWARD = 1e15  # beyond this a squared error overflows float32 in a value loss
MAX_DIMS = 32
EPISODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is a 400 saying what is wrong."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RequestError(400, f"the body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(data).__name__}.")
    return data


def field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``data[name]`` checked to be of ``kind`` (a missing field takes ``default`` when given)."""
    if name not in data:
        if default is ...:
            raise RequestError(400, f"the request has no '{name}' field.")
        return default
    value = data[name]
    # bool is an int in Python, never in a request
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = " or ".join(k.__name__ for k in _as_tuple(kind))
        raise RequestError(400, f"'{name}' must be {names}, got {type(value).__name__} {_short(value)}.")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, np.ndarray) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def episode_id(value: str) -> str:
    """An episode id as given: 1 to 128 letters, digits and ``_ . : -``."""
    if not EPISODE_ID.fullmatch(value):
        raise RequestError(
            400, f"an episode_id is 1 to 128 letters, digits, '_', '.', ':' or '-'; got {_short(value)}."
        )
    return value


def reward(value: float) -> float:
    """A reward: finite, and small enough to be squared in float32."""
    if not -MAX_REWARD <= value <= MAX_REWARD:
        raise RequestError(400, f"'reward' must be a finite number within ±{MAX_REWARD:g}, got {value}.")
    return float(value)


def _typed_array(value: dict[str, Any], what: str) -> npt.NDArray[Any]:
    """A ``{"dtype", "shape", "data"}`` typed array (base64 of C-order bytes)."""
    try:
        dtype = np.dtype(str(value["dtype"]))
        shape = tuple(int(n) for n in value["shape"])
        raw = base64.b64decode(str(value["data"]), validate=True)
    except (KeyError, TypeError, ValueError, OverflowError, binascii.Error) as e:
        raise RequestError(
            400, f"{what}: a typed array needs 'dtype' (e.g. 'float32'), 'shape' and base64 'data' ({e!r})."
        ) from None
    if dtype.kind not in "biuf" or dtype.byteorder == ">":
        raise RequestError(400, f"{what}: dtype {dtype} is not a little-endian bool, int, uint or float type.")
    bad = f"{what}: {len(raw)} bytes do not hold shape {list(shape)[:MAX_DIMS]} of {dtype}."
    if len(shape) > MAX_DIMS or any(n < 0 for n in shape) or len(raw) != dtype.itemsize * math.prod(shape):
        raise RequestError(400, bad)
    try:
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    except ValueError:  # an empty array with dimensions numpy cannot index
        raise RequestError(400, bad) from None


def _array(value: Any, space: gym.spaces.Box | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary, what: str) -> Any:
    array = _typed_array(value, what) if isinstance(value, dict) else _nested(value, what)
    if array.shape != space.shape:
        raise RequestError(400, f"{what} has shape {list(array.shape)}; the space {space} needs {list(space.shape)}.")
    want = np.dtype(space.dtype)
    if array.dtype.kind == "f" and want.kind != "f":
        raise RequestError(400, f"{what} holds floats; the space {space} holds {want}.")
    limits = np.iinfo(want) if want.kind in "iu" else None  # type: ignore[type-var]  # an int dtype here
    if limits is not None and array.size and (array.min() < limits.min or array.max() > limits.max):
        raise RequestError(400, f"{what} holds values outside {want}'s range.")
    with np.errstate(over="ignore"):
        array = array.astype(want, copy=False)
    if want.kind == "f" and not np.isfinite(array).all():
        raise RequestError(400, f"{what} holds values that are not finite {want} numbers.")
    return array


def _nested(value: Any, what: str) -> npt.NDArray[Any]:
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError(400, f"{what} is not a rectangular array of numbers.") from None
    if array.dtype.kind not in "biuf":
        raise RequestError(400, f"{what} is not an array of numbers: {_short(value)}.")
    return array


def space_value(value: Any, space: gym.Space[Any], what: str) -> Any:
    """A JSON value as the space's own value (arrays, ints, dicts, tuples), checked against it (a
    Box's bounds excepted: observations may leave them)."""
    if isinstance(space, gym.spaces.Box):
        return _array(value, space, what)
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        array = _array(value, space, what)
        if not space.contains(array):
            raise RequestError(400, f"{what} {_short(array.tolist())} is outside the space {space}.")
        return array
    if isinstance(space, gym.spaces.Discrete):
        if not isinstance(value, int) or isinstance(value, bool) or not space.contains(value):
            raise RequestError(
                400, f"{what} must be an int in [{space.start}, {space.start + space.n}), got {_short(value)}."
            )
        return value
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise RequestError(400, f"{what} must be an object with the keys {sorted(space.spaces)}, got {got}.")
        return {key: space_value(value[key], sub, f"{what}.{key}") for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, list) or len(value) != len(space.spaces):
            raise RequestError(400, f"{what} must be a list of {len(space.spaces)} values.")
        return tuple(space_value(v, sub, f"{what}[{i}]") for i, (v, sub) in enumerate(zip(value, space.spaces)))
    raise RequestError(400, f"{what}: the space {space} has no JSON form.")  # spaces.py admits none other


def observation(value: Any, spec: ObsSpec, out: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Write a JSON observation into ``out`` in the rollout's stored form (flattened when structured)."""
    obs = space_value(value, spec.space, "observation")
    try:
        spec.write(out, obs, "served")
    except EnvError as e:
        raise RequestError(400, str(e)) from None
    return out


def action(value: Any, spec: ActionSpec) -> npt.NDArray[Any]:
    """A JSON action (one an external simulator chose itself) in the rollout's form."""
    taken = np.asarray(space_value(value, spec.space, "action"), dtype=spec.space.dtype)
    if not spec.space.contains(taken if taken.ndim else taken.item()):
        raise RequestError(400, f"action {_short(taken.tolist())} is outside the space {spec.space}.")
    return taken.astype(spec.dtype)


def encode_action(taken: npt.NDArray[Any]) -> Any:
    """An action as JSON: an int for Discrete, a list otherwise."""
    return taken.tolist()


def describe_space(space: gym.Space[Any]) -> dict[str, Any]:
    """A space as JSON, for clients to check what they send."""
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bounds(space.low),
            "high": _bounds(space.high),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe_space(s) for s in space.spaces]}
    return {"type": type(space).__name__}


def _bounds(values: npt.NDArray[Any]) -> Any:
    """Bounds as JSON: one number when all are equal; infinities as null (JSON has none)."""
    flat = np.unique(values)
    as_json = [None if not np.isfinite(v) else v.item() for v in np.asarray(values, dtype=np.float64).ravel()]
    if len(flat) == 1:
        return as_json[0]
    return np.asarray(as_json, dtype=object).reshape(values.shape).tolist()
