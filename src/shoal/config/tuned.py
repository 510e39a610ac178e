"""Tuned configs: the settings shoal ships for an (algorithm, env) pair, used unless ``tuned=False``.

They live in the package (``shoal/tuned/<algo>/<env>.yaml``; a clone also shows them as
``configs/``), one file per pair, each citing where its settings come from. The file name is the
env id with ``/`` and ``:`` made ``-`` (``MinAtar/Breakout-v1`` -> ``MinAtar-Breakout-v1.yaml``).
A tuned config sits under everything the user sets: a ``--config`` file, keyword arguments and
``key=value`` pairs all override it.

Where no tuned config applies (none shipped for the pair, or ``tuned=false``), a run starts from the
defaults for its env's kind instead, when the algorithm ships them (``<algo>/kinds/<kind>.yaml``):
``image`` for image observations, else ``box`` for Box actions. Anything else (discrete actions on
vector observations, several agents) starts from the algorithm's own defaults.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.config.trainer import TrainerConfig
from shoal.errors import ConfigError, shorten
from shoal.yaml_io import load_yaml

TUNED_DIR = Path(__file__).resolve().parent.parent / "tuned"


def env_slug(env: str) -> str:
    """The file name stem of an env id's tuned configs."""
    return env.replace("/", "-").replace(":", "-")


def tuned_path(algo: str, env: Any) -> Path | None:
    """The tuned config of ``algo`` (a registered name) on ``env`` (an id), if shoal ships one."""
    if not isinstance(algo, str) or not isinstance(env, str) or ":" in algo:  # 'module:Class': the user's own
        return None
    path = TUNED_DIR / algo.lower() / f"{env_slug(env)}.yaml"
    try:
        return path if path.is_file() else None
    except OSError:  # a name too long for a file (ENAMETOOLONG): no tuned config has it
        return None


KINDS = {"image": "image observations", "box": "Box actions"}
"""The env kinds an algorithm may ship defaults for (``shoal.train.setup.env_kind`` tells them apart)."""


def kind_path(algo: str, kind: str) -> Path | None:
    """The defaults ``algo`` ships for envs of ``kind`` (a key of ``KINDS``), if any."""
    path = TUNED_DIR / algo.lower() / "kinds" / f"{kind}.yaml"
    return path if path.is_file() else None


def kind_source(path: Path) -> str:
    """Where a kind's defaults come from: its file's first line, ``# source: ...``."""
    first = path.read_text().partition("\n")[0]
    return first.removeprefix("# source:").strip()


@dataclass(frozen=True)
class TunedStart:
    """The file a run's settings start from (``path`` None: none): a tuned config, or the defaults
    for the env's ``kind``; and the keys it moved off the algorithm's own defaults, which a config
    error may then blame on it."""

    path: Path | None = None
    keys: frozenset[str] = frozenset()
    kind: str | None = None

    def announce(self) -> None:
        if self.path is None:
            return
        if self.kind is None:
            said = f"the tuned config {self.path} (--no-tuned or tuned=false: without it)"
        else:
            said = (
                f"the defaults for {KINDS[self.kind]}, {self.path} ({kind_source(self.path)}; "
                f"kind_defaults=false: without them)"
            )
        print(f"shoal: starting from {said}", file=sys.stderr)

    @contextlib.contextmanager
    def named_in_errors(self) -> Iterator[None]:
        """A config error naming keys the tuned config set says so, and how to leave it out."""
        try:
            yield
        except ConfigError as e:
            named = sorted(key for key in self.keys if re.search(rf"(?<![\w.]){re.escape(key)}=", str(e)))
            if not named:
                raise
            leave = "tuned=false" if self.kind is None else "kind_defaults=false"
            where = f"{'the tuned config ' if self.kind is None else ''}{self.path}; {leave} leaves it out"
            raise ConfigError(f"{e} ({', '.join(named)} came from {where}.)") from None


KindProbe = Callable[[], str | None]
"""Looks at the run's env and names its kind (a key of ``KINDS``; None: none of them)."""


def start_from_tuned(
    settings: dict[str, Any], algo: Any, config_class: type[TrainerConfig], env_kind: KindProbe | None = None
) -> tuple[dict[str, Any], TunedStart]:
    """``apply_tuned``, and what the run needs to say about it later."""
    merged, path, kind = _apply(settings, algo, config_class, env_kind)
    if path is None:
        return merged, TunedStart()
    defaults = config_class.build().settings()
    moved = {key for key in set(merged) - set(settings) if merged[key] != defaults.get(key)}
    return merged, TunedStart(path, frozenset(moved), kind)


def apply_tuned(
    settings: dict[str, Any], algo: Any, config_class: type[TrainerConfig], env_kind: KindProbe | None = None
) -> tuple[dict[str, Any], Path | None]:
    """``settings`` over the tuned config of its (``algo``, env) pair, when shoal has one and
    ``tuned`` is not False; else over ``algo``'s defaults for the kind ``env_kind`` names, when it
    ships them. Returns the merged settings and the file that supplied keys (None: nothing applied).

    Every key set replaces the tuned one whole, under either of its names (``config_class``'s
    ``ALIASES``), dicts too: ``model_config={"hiddens": [64]}`` is the whole model config. Setting
    ``model`` drops the tuned ``model_config``, written for the tuned model. Setting one of
    ``rollout_fragment_length``, ``train_batch_size``, ``batch_size`` and ``train_freq_unit``
    drops the tuned values of all four; and where minibatches must divide the batch (PPO, GRPO), a batch reshaped by
    the keys set keeps the tuned number of minibatches (else the default minibatch size)."""
    merged, path, _ = _apply(settings, algo, config_class, env_kind)
    return merged, path


def _apply(
    settings: dict[str, Any], algo: Any, config_class: type[TrainerConfig], env_kind: KindProbe | None
) -> tuple[dict[str, Any], Path | None, str | None]:
    """``apply_tuned``'s merge, with the kind that picked the file (None: a tuned config, or none)."""
    path, kind = _starting_file(settings, algo, env_kind)
    merged = _merge_under(settings, path, config_class) if path is not None else settings
    return (merged, path, kind) if merged is not settings else (settings, None, None)


def _starting_file(settings: dict[str, Any], algo: Any, env_kind: KindProbe | None) -> tuple[Path | None, str | None]:
    """The file a run's settings start from, and the env kind it was picked by (None: a tuned config)."""
    use, by_kind = (settings.get(key, True) for key in ("tuned", "kind_defaults"))
    for key, value in (("tuned", use), ("kind_defaults", by_kind)):
        if not isinstance(value, bool):
            raise ConfigError(f"bad value for '{key}': {shorten(repr(value))}: expected true or false.")
    path = tuned_path(algo, settings.get("env")) if use else None
    if path is not None or not by_kind or env_kind is None or not isinstance(algo, str) or ":" in algo:
        return path, None
    if not (TUNED_DIR / algo.lower() / "kinds").is_dir():  # nothing to pick: the env is not looked at
        return None, None
    kind = env_kind()
    path = kind_path(algo, kind) if kind is not None else None
    return (path, kind) if path is not None else (None, None)


def _merge_under(settings: dict[str, Any], path: Path, config_class: type[TrainerConfig]) -> dict[str, Any]:
    """``settings`` over the file at ``path`` by the rules ``apply_tuned`` gives (``settings`` itself
    when the file supplies nothing)."""
    aliases = config_class.ALIASES
    given = {aliases.get(key, key) for key in settings}
    tuned = {aliases.get(k, k): v for k, v in load_yaml(path).items()}
    if given & BATCH_SHAPE:
        given |= BATCH_SHAPE
    if "model" in given:
        given.add("model_config")
    reshaped = bool(given & (BATCH_SHAPE | {"num_envs"}))
    if reshaped and config_class.MINIBATCH_DIVIDES_BATCH and "sgd_minibatch_size" not in given:
        given.add("sgd_minibatch_size")
        minibatch = _same_minibatch_count(tuned, settings)
        if minibatch is not None:
            tuned["sgd_minibatch_size"] = minibatch
            given.discard("sgd_minibatch_size")
    supplied = {k: v for k, v in tuned.items() if k not in given}
    return supplied | settings if supplied else settings


BATCH_SHAPE = {"rollout_fragment_length", "train_batch_size", "batch_size", "train_freq_unit"}
"""Keys that say the same thing (with ``num_envs``): how many steps an iteration (a replay
learner's phase) collects."""


def _same_minibatch_count(tuned: dict[str, Any], settings: dict[str, Any]) -> int | None:
    """The minibatch size that splits the batch ``settings`` shape into as many minibatches as
    the tuned config's (None: not a whole number, or a shape given in agent steps)."""
    keys = ("num_envs", "rollout_fragment_length", "sgd_minibatch_size")
    if "batch_size" in settings or not all(isinstance(tuned.get(k), int) for k in keys):
        return None
    count = tuned["num_envs"] * tuned["rollout_fragment_length"] // tuned["sgd_minibatch_size"]
    if count < 1:  # a minibatch counted in agent steps, larger than an iteration's env steps
        return None
    envs = settings.get("num_envs", tuned["num_envs"])
    batch = settings.get("train_batch_size") or envs * settings.get(
        "rollout_fragment_length", tuned["rollout_fragment_length"]
    )
    return batch // count if isinstance(batch, int) and batch % count == 0 else None
