"""The run's lifecycle: the trainer, callbacks, checkpoints, evaluation."""

from shoal.train.trainer import Trainer

__all__ = ["Trainer"]
