"""Published returns a benchmark row is judged against, and what a random policy scores.

Both live in one data file, ``shoal/tuned/references.yaml`` (``configs/references.yaml`` in a
clone), each figure with its source and the env steps it was reached in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.config.tuned import TUNED_DIR
from shoal.errors import ConfigError, shorten
from shoal.yaml_io import load_yaml

REFERENCES_FILE = TUNED_DIR / "references.yaml"
SHARE = 0.9
"""A row meets its reference at 90% of it (for tasks whose reference return is negative: 90% of
the way from the random policy's return to the reference's)."""


@dataclass(frozen=True)
class Reference:
    algo: str
    env: str
    value: float
    """The published final return."""
    steps: int
    """The env steps it was reached in."""
    source: str
    std: float | None = None


@dataclass(frozen=True)
class References:
    published: dict[tuple[str, str], Reference]
    """(algo, env id) -> the published figure."""
    random: dict[str, float]
    """env id -> mean return of uniformly random actions."""

    def score(self, algo: str, env: str, value: float) -> float | None:
        """How much of the reference ``value`` reaches (1.0: all of it; None: no reference)."""
        ref = self.published.get((algo, env))
        if ref is None:
            return None
        if ref.value > 0:
            return value / ref.value
        floor = self.random[env]  # checked on load for every negative reference
        return (value - floor) / (ref.value - floor)


_FIELDS = {"algo", "env", "return", "steps", "source", "std"}


def load_references(path: str | Path = REFERENCES_FILE) -> References:
    """Read and check a references file: ``random`` (env -> return) and ``references`` (a list of
    ``{algo, env, return, steps, source[, std]}``)."""
    data = load_yaml(path)
    unknown = set(data) - {"random", "references"}
    if unknown:
        raise ConfigError(
            f"references file '{path}' has unknown keys {shorten(str(sorted(unknown)))}; allowed: random, references."
        )
    try:
        random = {str(env): float(value) for env, value in (data.get("random") or {}).items()}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"references file '{path}': 'random' must map env ids to returns ({e}).") from None
    published: dict[tuple[str, str], Reference] = {}
    for i, entry in enumerate(data.get("references") or []):
        where = f"{path}: references[{i}]"
        if not isinstance(entry, dict) or not {"algo", "env", "return", "steps", "source"} <= entry.keys():
            raise ConfigError(
                f"{where} must be a mapping with algo, env, return, steps and source, got {shorten(repr(entry))}."
            )
        extra = set(entry) - _FIELDS
        if extra:
            raise ConfigError(
                f"{where} has unknown keys {shorten(str(sorted(extra, key=str)))}; allowed: {sorted(_FIELDS)}."
            )
        try:
            ref = _reference(entry)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"{where}: return, steps and std must be numbers ({e}), got {shorten(repr(entry))}."
            ) from None
        if (ref.algo, ref.env) in published:
            raise ConfigError(f"{where}: a second reference for {ref.algo} on {ref.env}; keep one.")
        if ref.value <= 0 and ref.env not in random:
            raise ConfigError(
                f"{where} ({ref.algo} on {ref.env}) has a return of {ref.value}: judging it needs the random "
                f"policy's return for {ref.env} under 'random'."
            )
        published[(ref.algo, ref.env)] = ref
    return References(published, random)


def _reference(entry: dict[str, Any]) -> Reference:
    std = entry.get("std")
    return Reference(
        str(entry["algo"]),
        str(entry["env"]),
        float(entry["return"]),
        int(entry["steps"]),
        str(entry["source"]),
        None if std is None else float(std),
    )
