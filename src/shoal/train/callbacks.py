"""Trainer hooks (RLlib's callbacks, plain): subclass ``Callback`` and override what you need.

Every hook may return True to stop training after the current iteration (the run is then
checkpointed like any other stop). ``config.callbacks`` takes instances, classes, or
``"package.module:Name"`` strings (the only form that survives a checkpoint, since objects are
not pickled into it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.collect.episodes import Episode
from shoal.errors import ConfigError
from shoal.imports import import_spec

if TYPE_CHECKING:
    from shoal.algos.base import Trajectory
    from shoal.train.trainer import Trainer


class Callback:
    """Base class of trainer hooks: override the ones you need; any may return True to stop
    training after the current iteration."""

    def on_episode_end(self, trainer: Trainer, episode: Episode) -> bool | None:
        """An episode finished; add to ``episode.custom_metrics`` to aggregate more numbers."""

    def on_train_result(self, trainer: Trainer, result: dict[str, Any]) -> bool | None:
        """An iteration finished; ``result`` is what ``train()`` returns."""

    def on_evaluate_end(self, trainer: Trainer, evaluation: dict[str, Any]) -> bool | None:
        """A periodic evaluation finished."""

    def on_checkpoint(self, trainer: Trainer, path: Path) -> bool | None:
        """A checkpoint was written to ``path``."""

    def on_postprocess_trajectory(self, trainer: Trainer, trajectory: Trajectory) -> bool | None:
        """A rollout was collected: change ``trajectory.rollout["reward"]`` or add fields at
        ``trajectory.mask`` (one policy's steps) before the learner reads them; called once per
        policy, after the algorithm's own ``postprocess_trajectory``."""


HOOKS = ("on_episode_end", "on_train_result", "on_evaluate_end", "on_checkpoint", "on_postprocess_trajectory")


def _instantiate(spec: Any) -> object:
    """The callback object ``spec`` gives: any object with one of the hooks (a ``Callback`` or not)."""
    if isinstance(spec, str):
        spec = import_spec(spec, "callback")
    if isinstance(spec, type):
        spec = spec()
    if not any(callable(getattr(spec, hook, None)) for hook in HOOKS):
        raise ConfigError(f"callback {spec!r} has none of the hooks {', '.join(HOOKS)}; subclass shoal.Callback.")
    return spec


class CallbackList:
    """Calls each hook on every callback that defines it; remembers whether any asked to stop."""

    def __init__(self, specs: list[Any]):
        self.callbacks = [_instantiate(s) for s in specs]
        self.stop_requested = False

    def has(self, hook: str) -> bool:
        return any(
            getattr(type(cb), hook, None) is not getattr(Callback, hook)
            for cb in self.callbacks
            if callable(getattr(cb, hook, None))
        )

    def __call__(self, hook: str, trainer: Trainer, arg: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if fn is not None and fn(trainer, arg):
                self.stop_requested = True
