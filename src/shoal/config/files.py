"""Command-line overrides: ``key=value`` pairs, each value read as YAML (``shoal.yaml_io``, the
reader of config files too), merged over a file's keys."""

from __future__ import annotations

from typing import Any

from shoal.errors import ConfigError, shorten
from shoal.yaml_io import parse_yaml_value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` command-line pairs; values are read as YAML, and a dotted key sets one
    key of a dict-valued key (``model_config.hiddens=[64,64]``, ``policies.p.learning_rate=1e-4``)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        parts = [part.strip() for part in key.split(".")]
        if not sep or not all(parts):
            raise ConfigError(f"expected key=value, got '{shorten(pair)}'.")
        nested: dict[str, Any] = {parts[-1]: parse_yaml_value(raw, key)}
        for part in reversed(parts[:-1]):
            nested = {part: nested}
        out = merge_settings(out, nested)
    return out


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, where a dict value updates the dict it replaces key by key, at
    every depth (``model_config.hiddens=[32]`` on the command line keeps the YAML file's other
    model_config keys); any other value replaces what was there."""
    out = dict(base)
    for key, value in extra.items():
        before = out.get(key)
        out[key] = merge_settings(before, value) if isinstance(value, dict) and isinstance(before, dict) else value
    return out
