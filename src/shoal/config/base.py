"""``ConfigModel``: what every config class shares besides its keys.

- Each key is declared once, as a pydantic field (type, range, docstring) in the most general class
  that has it. A family or algorithm that wants another default says so as data, in ``DEFAULTS``
  (key -> default), and may add a sentence on what the key means for it in ``NOTES`` (key -> note,
  shown after the key's docstring in the docs tables). Both are checked when the class is made: an
  unknown key, or a default the key's type and range refuse, fails there.
- Keys as users write them: a field's alias (``model_config``) and other names (``ALIASES``).
- ``build(**settings)``: validation whose first problem becomes one ``ConfigError`` that says what
  to change.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import types
import typing
from copy import copy
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

from shoal.errors import ConfigError, did_you_mean, nearest_keys, shorten

if TYPE_CHECKING:
    from typing_extensions import Self


class ConfigModel(BaseModel):
    """A config: keys declared once, defaults set per subclass as data (``DEFAULTS``)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=False, arbitrary_types_allowed=True, allow_inf_nan=False, defer_build=True
    )

    DEFAULTS: ClassVar[dict[str, Any]] = {}
    """Key -> this class's default for a key a base class declares (read from the class body only)."""
    NOTES: ClassVar[dict[str, str]] = {}
    """Key -> what the key means here besides its docstring, for the docs tables (this class and its subclasses)."""
    ALIASES: ClassVar[dict[str, str]] = {}
    """Other names of keys: alias -> key."""
    MOVED: ClassVar[dict[str, str]] = {}
    """Keys that moved: old name -> what to write instead."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Apply the class body's ``DEFAULTS``: each named field is copied from the base with the new
        default, so ``model_fields``, instances and the JSON schema all show it. The schema is built
        from these fields when the class is first used (``defer_build``): a run builds the configs
        of its own algorithm, not all of them, at start-up."""
        super().__pydantic_init_subclass__(**kwargs)
        for table in ("DEFAULTS", "NOTES"):
            for key in cls.__dict__.get(table, {}):
                cls.field_name(key, table)
        defaults = cls.__dict__.get("DEFAULTS", {})
        if not defaults:
            return
        for key, value in defaults.items():
            name = cls.field_name(key, "DEFAULTS")
            if name in inspect.get_annotations(cls):
                raise TypeError(
                    f"{cls.__name__}.DEFAULTS sets '{key}', which {cls.__name__} declares: give the default in its "
                    f"Field instead."
                )
            field = copy(cls.__pydantic_fields__[name])
            _check_default(cls, key, field.annotation, field.metadata, value)
            field.default, field.default_factory = value, None  # pydantic copies a mutable default per instance
            cls.__pydantic_fields__[name] = field
        if cls.__pydantic_complete__:  # a subclass that turned defer_build off was built without them
            cls.model_rebuild(force=True)

    @classmethod
    def field_name(cls, key: str, table: str = "DEFAULTS") -> str:
        """The field behind ``key`` as users write it (a field name, its alias or one of ``ALIASES``);
        a TypeError naming ``table`` when it is none."""
        key = cls.ALIASES.get(key, key)
        names = {field.alias or name: name for name, field in cls.model_fields.items()}
        if key in names or key in cls.model_fields:
            return names.get(key, key)
        raise TypeError(
            f"{cls.__name__}.{table} names '{key}', which is not a key of {cls.__name__}.{did_you_mean(key, names)}"
        )

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        """Counts written as ``1e5``, ``100_000`` or ``100k`` (a string from the command line or a
        file) are integers for the keys that take one, where the number is whole."""
        if not isinstance(data, dict):
            return data
        counts = _count_keys(cls)
        fixed = {k: whole_number(v) for k, v in data.items() if k in counts and isinstance(v, str | float)}
        return data | {k: v for k, v in fixed.items() if v is not None}

    @model_validator(mode="before")
    @classmethod
    def _resolve_aliases(cls, data: Any) -> Any:
        """``minibatch_size=...`` is ``sgd_minibatch_size=...``; both at once must agree."""
        if not isinstance(data, dict) or not any(alias in data for alias in cls.ALIASES):
            return data
        data = dict(data)
        for alias, key in cls.ALIASES.items():
            if alias not in data:
                continue
            value = data.pop(alias)
            if key in data and data[key] is not None and data[key] != value:
                raise ConfigError(
                    f"{alias}={shorten(str(value))} and {key}={shorten(str(data[key]))} are two names of one key; "
                    "set one of them."
                )
            data[key] = value
        return data

    @classmethod
    def keys(cls) -> list[str]:
        """The config's keys as users write them (and their other names)."""
        return [field.alias or name for name, field in cls.model_fields.items()] + list(cls.ALIASES)

    def settings(self) -> dict[str, Any]:
        """Every key's value, keyed as users write them (``build(**settings())`` rebuilds the config)."""
        return {field.alias or name: getattr(self, name) for name, field in type(self).model_fields.items()}

    @classmethod
    def build(cls, **overrides: Any) -> Self:
        """Validate ``overrides`` into a config, turning pydantic's errors into one clear ConfigError."""
        known = cls.keys()
        unknown = [k for k in overrides if k not in known]
        if unknown:
            k = unknown[0]
            if k in cls.MOVED:
                raise ConfigError(
                    f"'{k}' is a model_config key now: {cls.MOVED[k]} (on the command line model_config.{k}=...)."
                )
            raise ConfigError(
                f"unknown config key '{shorten(k)}' for {cls.__name__}.{nearest_keys(k, known)} Every key is in "
                f"docs/configuration.md."
            )
        try:
            return cls(**overrides)
        except ValidationError as e:
            first = e.errors()[0]
            if first["type"] == "value_error" and not first["loc"]:  # our own cross-key checks
                raise ConfigError(str(first["ctx"]["error"])) from None
            key = ".".join(str(p) for p in first["loc"]) or "config"
            top = str(first["loc"][0]) if first["loc"] else ""
            value = overrides.get(top) if top else None
            field = {f.alias or n: f for n, f in cls.model_fields.items()}.get(top)
            if field is not None and _is_union(field.annotation):
                # pydantic reports the first alternative's complaint under its type's name: say them all
                allowed = str(field.annotation).replace("typing.", "")
                raise ConfigError(f"bad value for '{top}': {shorten(repr(value))}: expected {allowed}.") from None
            raise ConfigError(f"bad value for '{key}': {shorten(repr(value))}: {first['msg']}.") from None


def _check_default(cls: type, key: str, annotation: Any, metadata: list[Any], value: Any) -> None:
    """A TypeError unless ``value`` is a value the field accepts as it is (its type and range)."""
    parts = (annotation, *metadata)  # Annotated[annotation, *metadata], in Python 3.10's syntax
    checked: Any = Annotated[parts] if metadata else annotation
    adapter: TypeAdapter[Any] = TypeAdapter(checked, config=ConfigDict(allow_inf_nan=False))
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as e:
        problem = e.errors()[0]["msg"]
        raise TypeError(
            f"{cls.__name__}.DEFAULTS['{key}'] = {value!r} is not a valid {key}: {problem[0].lower()}{problem[1:]}."
        ) from None


def nearest(options: list[int], target: int) -> int:
    """The option closest to ``target`` by ratio (the larger on a tie)."""
    return min(options, key=lambda d: (abs(math.log(d / target)), -d))


def _is_union(annotation: Any) -> bool:
    """A union of two or more types besides None (``bool | float | None``, not ``int | None``)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    return len([a for a in typing.get_args(annotation) if a is not type(None)]) > 1


COUNT = re.compile(r"[+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:(?P<exp>[eE][+-]?\d+)|(?P<unit>[kKmM]))?")
UNITS = {"": 1, "k": 1_000, "m": 1_000_000}


def whole_number(value: str | float) -> int | None:
    """``value`` as an int when it is a whole number: a float, or a string such as ``1e5``,
    ``100_000``, ``2.5k`` or ``1M`` (k: thousand, M: million); else None."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    text = value.strip()
    match = COUNT.fullmatch(text)
    if match is None:
        return None
    unit = match["unit"] or ""
    number = float(text[: len(text) - len(unit)].replace("_", "")) * UNITS[unit.lower()]
    return int(number) if number.is_integer() else None


@functools.cache
def _count_keys(cls: type[ConfigModel]) -> frozenset[str]:
    """The keys (as users write them) whose type takes an int and neither a float nor a string."""

    def kinds(annotation: Any) -> set[Any]:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is Annotated:
            return kinds(args[0])
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            return set().union(*(kinds(a) for a in args))
        return {annotation}

    keys = set()
    for name, field in cls.model_fields.items():
        found = kinds(field.annotation)
        if int in found and not found & {float, str, bool}:
            keys.update({name, field.alias or name, *(a for a, k in cls.ALIASES.items() if k in (name, field.alias))})
    return frozenset(keys)
