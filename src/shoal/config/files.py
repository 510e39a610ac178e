"""Config files and command-line overrides: YAML read with ``safe_load`` only, ``key=value`` pairs
merged over a file's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shoal.errors import ConfigError


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` command-line pairs; values are read as YAML (``model_config.hiddens=[64,64]``
    sets one key of a dict-valued key)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got '{pair}'.")
        value = yaml.safe_load(raw) if raw.strip() else None
        outer, dot, inner = key.strip().partition(".")
        out = merge_settings(out, {outer: {inner: value}} if dot else {outer: value})
    return out


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, where a dict value updates the dict it replaces key by key
    (``model_config.hiddens=[32]`` on the command line keeps the YAML file's other model_config keys)."""
    out = dict(base)
    for key, value in extra.items():
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = out[key] | value if both_dicts else value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (safe_load only: YAML tags cannot build Python objects)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist.")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of key: value, got {type(data).__name__}.")
    return data
