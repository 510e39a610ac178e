"""Objects named in configs as ``'package.module:Name'`` (an algorithm, a model, a callback, a
mapping function...): the one place such names are imported, so every key reports a bad one alike."""

from __future__ import annotations

import importlib
import re
from typing import Any

from shoal.errors import ConfigError, shorten

_SPEC = re.compile(r"[\w.]+:[\w.]+")


def is_spec(value: Any) -> bool:
    """``value`` has the form 'package.module:Name'."""
    return isinstance(value, str) and _SPEC.fullmatch(value) is not None


def import_spec(spec: str, key: str) -> Any:
    """The object ``spec`` ('package.module:Name') names; a ConfigError naming ``key`` otherwise."""
    if not is_spec(spec):
        raise ConfigError(f"{key} {shorten(repr(spec))} must be 'package.module:Name'.")
    module, _, name = spec.partition(":")
    try:
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key} {shorten(repr(spec))} cannot be imported ({shorten(str(e))}).") from None
    return target


def importable(spec: Any) -> bool:
    """``spec`` is a 'package.module:Name' that imports (e.g. in a process loading a checkpoint)."""
    try:
        import_spec(spec, "name")
    except ConfigError:
        return False
    return True


def spec_of(obj: Any) -> str:
    """'module:QualifiedName' of a class or function, as configs store it."""
    return f"{obj.__module__}:{obj.__qualname__}"
