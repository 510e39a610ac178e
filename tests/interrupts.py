"""A callback that interrupts training as Ctrl-C does, for tests of what a resume keeps."""

import os
import signal

from shoal.train.callbacks import Callback


class InterruptAt(Callback):
    """Sends this process SIGINT at its ``iteration``-th iteration, once."""

    def __init__(self, iteration):
        self.iteration, self.sent = iteration, False

    def on_train_result(self, trainer, result):
        if not self.sent and trainer.iteration == self.iteration:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return False
