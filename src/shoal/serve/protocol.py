"""The policy server's wire format: JSON over HTTP, version 1 (docs/serving.md describes it).

Observations and actions travel as plain JSON values shaped like the env's spaces (a Box as
nested lists, a Discrete as an int, a Dict as an object, a Tuple as a list), or, for large arrays,
as a typed array ``{"dtype": "uint8", "shape": [84, 84, 4], "data": "<base64 of the C-order
bytes>"}``. Nothing is ever unpickled or evaluated: every value is checked against its space here,
by one set of rules for both forms (docs/serving.md lists them), and what does not fit is a
``RequestError`` (HTTP 400) naming the field, what came and what fits.
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


def parse_body(body: bytes) -> tuple[dict[str, Any], bool]:
    """A request body as a JSON object, and whether it may hold a bool: False when its text has
    neither ``true`` nor ``false``, the only way JSON writes one (``space_value``'s ``bools``).
    Anything else is a 400 saying what is wrong."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads decodes bytes
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RequestError(400, f"the body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(data).__name__}.")
    return data, "true" in text or "false" in text


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


ArraySpace = gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary


def _array(value: Any, space: ArraySpace, what: str, bools: bool) -> npt.NDArray[Any]:
    """``value`` (nested lists or a typed array) as a value of ``space``, by the rules docs/serving.md
    lists: the space's shape; numbers for a numeric space (ints too for a float one, floats only if
    whole for an integer one) and true/false for a boolean one; floats finite in float32, the dtype
    shoal keeps them in; and each element within the bounds ``space.contains`` checks."""
    want, shape = np.dtype(space.dtype), space.shape or ()  # (gym.Space's shape is Optional; these have one)
    needs = f"{want} of shape {list(shape)}"
    fits = f"{space} holds {needs}"
    given = _typed_array(value, what) if isinstance(value, dict) else _nested(value, what, fits, bools)
    if given.shape != shape:
        raise RequestError(400, f"{what} has shape {list(given.shape)}; the space {space} needs {list(shape)}.")
    if (given.dtype.kind == "b") != (want.kind == "b"):
        held = "true/false" if given.dtype.kind == "b" else "numbers"
        raise RequestError(400, f"{what} holds {held}; the space {space} holds {needs}.")
    if given.dtype.kind == "f":
        with np.errstate(over="ignore"):
            if not np.isfinite(given.astype(np.float32)).all():
                raise RequestError(
                    400, f"{what} holds values that are not finite float32 numbers (NaN, infinity, beyond ±3.4e38)."
                )
        if want.kind != "f" and (fractions := given[given != np.trunc(given)]).size:
            raise RequestError(
                400,
                f"{what} holds floats that are not whole numbers ({fractions[0]!s}); the space {space} holds {needs}.",
            )
    # compared as contains compares: floats in the space's dtype; integers before the cast, which wraps
    array = given.astype(want) if want.kind == "f" else given
    low, high = (np.broadcast_to(bound, shape) for bound in _limits(space))
    outside = ~((array >= low) & (array <= high))
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        where = what + (f"[{', '.join(map(str, index))}]" if index else "")
        raise RequestError(
            400,
            f"{where} is {array[index]!s}, outside [{low[index]!s}, {high[index]!s}], the bounds of the space {space}.",
        )
    return array.astype(want, copy=False)


def _limits(space: ArraySpace) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """The least and the greatest value of the space's elements."""
    if isinstance(space, gym.spaces.Box):
        return space.low, space.high
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros(space.shape, np.int8), np.ones(space.shape, np.int8)
    n = space.n if isinstance(space, gym.spaces.Discrete) else space.nvec  # values from start
    return np.asarray(space.start), np.asarray(space.start + n - 1)


def _nested(value: Any, what: str, fits: str, bools: bool) -> npt.NDArray[Any]:
    """Nested lists of numbers (or of true/false) as an array; ``fits`` says what the space holds,
    ``bools`` whether ``value`` may hold a bool."""
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError(400, f"{what} is not a rectangular array of numbers.") from None
    if array.dtype.kind not in "biuf":
        raise RequestError(400, f"{what} is not an array of numbers: {_short(value)}.")
    # numpy reads true and false among numbers as 1 and 0: only the values themselves tell, and looking
    # at each takes as long as reading them, so it is done only when the JSON may hold a bool
    held = bools and array.dtype.kind != "b" and array.ndim
    if held and any(type(v) is bool for v in np.asarray(value, object).flat):
        raise RequestError(400, f"{what} mixes true/false with numbers; the space {fits}.")
    return array


def space_value(value: Any, space: gym.Space[Any], what: str, bools: bool = True) -> Any:
    """A JSON value as the space's own value (arrays, ints, dicts, tuples), checked against it.
    ``bools``: whether the value may hold a bool (False: the JSON it came from has none, as
    ``parse_body`` tells)."""
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return _array(value, space, what, bools)
    if isinstance(space, gym.spaces.Discrete):
        return int(_array(value, space, what, bools))
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise RequestError(400, f"{what} must be an object with the keys {sorted(space.spaces)}, got {got}.")
        return {key: space_value(value[key], sub, f"{what}.{key}", bools) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, list) or len(value) != len(space.spaces):
            raise RequestError(400, f"{what} must be a list of {len(space.spaces)} values.")
        return tuple(space_value(v, sub, f"{what}[{i}]", bools) for i, (v, sub) in enumerate(zip(value, space.spaces)))
    raise RequestError(400, f"{what}: the space {space} has no JSON form.")  # spaces.py admits none other


def observation(value: Any, spec: ObsSpec, out: npt.NDArray[Any], bools: bool = True) -> npt.NDArray[Any]:
    """Write a JSON observation into ``out`` in the rollout's stored form (flattened when structured);
    ``bools`` as ``space_value`` takes it."""
    obs = space_value(value, spec.space, "observation", bools)
    try:
        spec.write(out, obs, "served")
    except EnvError as e:
        raise RequestError(400, str(e)) from None
    return out


def action(value: Any, spec: ActionSpec, bools: bool = True) -> npt.NDArray[Any]:
    """A JSON action (one an external simulator chose itself) in the rollout's form; ``bools`` as
    ``space_value`` takes it."""
    return np.asarray(space_value(value, spec.space, "action", bools), dtype=spec.dtype)


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
