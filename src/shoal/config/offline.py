"""The checks of ``input`` and ``output``: what a recorded-data run may ask for."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shoal.errors import ConfigError, did_you_mean, shorten

if TYPE_CHECKING:
    from shoal.config.trainer import TrainerConfig

FQE_KEYS = ("iterations", "hidden", "epochs_per_iteration", "lr", "batch_size")
"""``off_policy_estimation_config``'s keys: fitted Q evaluation's settings (``gamma`` and ``seed``
are the run's)."""


def absolute(path: str) -> str:
    """``path`` from the root (``~`` expanded): a saved run's config finds its datasets from any
    working directory."""
    return os.path.abspath(os.path.expanduser(path))


def check_offline(c: TrainerConfig) -> None:
    """Checks the dataset keys, and makes their folders absolute."""
    spec = c.input
    if isinstance(spec, dict):
        bad = {k: w for k, w in spec.items() if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0}
        if bad or not spec:
            raise ConfigError(
                f"input={shorten(repr(spec))}: a dict of inputs maps each dataset folder to a mixing weight > 0"
                + (f"; {shorten(repr(bad))} is not." if bad else ".")
            )
    elif isinstance(spec, list):
        if not spec or not all(isinstance(p, str) and p for p in spec):
            raise ConfigError(f"input={shorten(repr(spec))}: a list of inputs holds dataset folders (strings).")
    elif not isinstance(spec, str) or not spec:
        raise ConfigError(
            f"input={shorten(repr(spec))} is neither 'sampler' (the envs), a dataset folder, a list of them nor a "
            f"dict of folder -> mixing weight."
        )
    reads = spec != "sampler"
    if isinstance(spec, dict | list):
        folders = [absolute(p) for p in spec]
        if twice := sorted({p for p in spec if folders.count(absolute(p)) > 1}):
            raise ConfigError(f"input names one folder more than once: {twice}; give each folder once.")
    if reads:
        c.input = (
            absolute(spec)
            if isinstance(spec, str)
            else [absolute(p) for p in spec]
            if isinstance(spec, list)
            else {absolute(p): w for p, w in spec.items()}
        )
    if c.output is not None:
        c.output = absolute(c.output)
    if c.off_policy_estimation_input is not None:
        c.off_policy_estimation_input = absolute(c.off_policy_estimation_input)
    name = type(c).__name__.removesuffix("Config")
    if c.env is None and not reads:
        raise ConfigError(
            "env=None: a run with no env learns from datasets only; set input to a dataset folder, or give env."
        )
    if reads and not c.READS_DATASETS:
        raise ConfigError(
            f"input={shorten(repr(spec))}: {name} learns from its own policy's steps, so it takes input='sampler' "
            f"only; the replay learners (dqn, sac, td3) and the offline ones (bc, marwil, cql) read datasets."
        )
    if reads and c.normalize_reward:
        raise ConfigError(
            f"normalize_reward=true scales rewards by the running spread of the returns the envs give as they are "
            f"stepped; input={shorten(repr(spec))} reads recorded rewards, which the learner takes as recorded "
            f"(clip_rewards applies to them). Drop normalize_reward, or scale the rewards when recording."
        )
    if reads and c.output is not None:
        raise ConfigError(f"output={shorten(repr(c.output))} writes what the envs give, but input reads a dataset.")
    for key in c.off_policy_estimation_config:
        if key not in FQE_KEYS:
            raise ConfigError(
                f"off_policy_estimation_config has no key {key!r}: it takes fitted Q evaluation's {list(FQE_KEYS)} "
                f"(gamma and seed are the run's).{did_you_mean(str(key), FQE_KEYS)}"
            )
    if c.off_policy_estimation_methods and c.off_policy_estimation_input is None and not isinstance(spec, str):
        raise ConfigError(
            "off_policy_estimation_methods read one dataset: set off_policy_estimation_input (input names several)."
        )
    if c.off_policy_estimation_methods and c.off_policy_estimation_input is None and not reads:
        raise ConfigError(
            f"off_policy_estimation_methods={c.off_policy_estimation_methods} need recorded episodes: set "
            f"off_policy_estimation_input to a dataset folder."
        )
