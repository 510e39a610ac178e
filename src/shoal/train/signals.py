"""Signal handlers installed for the length of a block, and the ones a training run stops on."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from shoal.errors import RunInterrupted
from shoal.train import faults

if TYPE_CHECKING:
    from shoal.train.trainer import Trainer

Handler = Callable[[int, FrameType | None], None]


@contextlib.contextmanager
def handling(signals: tuple[signal.Signals, ...], handler: Handler) -> Iterator[None]:
    """Runs the block with ``handler`` for ``signals`` and puts the previous handlers back after.
    Python sets handlers only from the main thread; in any other the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    try:  # installed one by one inside the try: a signal between two leaves none of them behind
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_requests(trainer: Trainer) -> Iterator[None]:
    """SIGINT and SIGTERM set the trainer's ``stop_reason``, which stops its loop at the next
    iteration boundary, where the state is whole and can be checkpointed. A second SIGINT stops at
    once: the block ends with ``RunInterrupted``, whose message says what was kept, also when the
    interrupt surfaced as another error (torch's checkpoint writer, cut short, raises its own)."""
    interrupted = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if trainer.stop_reason is not None and signum == signal.SIGINT:
            interrupted = True
            raise KeyboardInterrupt
        trainer.stop_reason = signal.Signals(signum).name

    try:
        with handling((signal.SIGINT, signal.SIGTERM), request_stop):
            yield
    except BaseException:
        if interrupted:
            raise RunInterrupted(faults.interrupted(trainer)) from None
        raise
