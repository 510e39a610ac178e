"""Tuned configs: the settings shoal ships for an (algorithm, env) pair, used unless ``tuned=False``.

They live in the package (``shoal/tuned/<algo>/<env>.yaml``; a clone also shows them as
``configs/``), one file per pair, each citing where its settings come from. The file name is the
env id with ``/`` and ``:`` made ``-`` (``MinAtar/Breakout-v1`` -> ``MinAtar-Breakout-v1.yaml``).
A tuned config sits under everything the user sets: a ``--config`` file, keyword arguments and
``key=value`` pairs all override it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal.config.trainer import load_yaml, merge_settings

TUNED_DIR = Path(__file__).resolve().parent.parent / "tuned"


def env_slug(env: str) -> str:
    """The file name stem of an env id's tuned configs."""
    return env.replace("/", "-").replace(":", "-")


def tuned_path(algo: str, env: Any) -> Path | None:
    """The tuned config of ``algo`` (a registered name) on ``env`` (an id), if shoal ships one."""
    if not isinstance(algo, str) or not isinstance(env, str) or ":" in algo:  # 'module:Class': the user's own
        return None
    path = TUNED_DIR / algo.lower() / f"{env_slug(env)}.yaml"
    return path if path.is_file() else None


BATCH_SHAPE = {"rollout_fragment_length", "train_batch_size", "batch_size"}
"""Keys that say one thing between them (with ``num_envs``): the batch's shape."""


def apply_tuned(
    settings: dict[str, Any], algo: Any, aliases: dict[str, str] | None = None
) -> tuple[dict[str, Any], Path | None]:
    """``settings`` on top of the tuned config for its (``algo``, env) pair when there is one, it
    sets a key ``settings`` leaves out, and ``tuned`` is not False; returns the merged settings
    and the file that supplied keys (None: nothing applied).

    A key set under either of its names (``aliases``: other name -> key) replaces the tuned one,
    and setting any of ``BATCH_SHAPE`` drops the tuned values of all three, so the batch is shaped
    as the user says (the tuned ``num_envs`` still counts)."""
    path = tuned_path(algo, settings.get("env")) if settings.get("tuned", True) else None
    if path is None:
        return settings, None
    aliases = aliases or {}
    given = {aliases.get(key, key) for key in settings}
    dropped = given | (BATCH_SHAPE if given & BATCH_SHAPE else set())
    tuned = {k: v for k, v in load_yaml(path).items() if aliases.get(k, k) not in dropped or isinstance(v, dict)}
    merged = merge_settings(tuned, settings)
    return (merged, path) if merged != settings else (settings, None)


def tuned_pairs() -> list[tuple[str, str]]:
    """Every (algorithm, env id) pair with a tuned config."""
    pairs = []
    for path in sorted(TUNED_DIR.glob("*/*.yaml")):
        data = load_yaml(path)
        if "env" in data and path.parent.name == data.get("algo"):
            pairs.append((path.parent.name, str(data["env"])))
    return pairs
