"""Signal handlers installed for the length of a block."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

Handler = Callable[[int, FrameType | None], None]


@contextlib.contextmanager
def handling(signals: tuple[signal.Signals, ...], handler: Handler) -> Iterator[None]:
    """Runs the block with ``handler`` for ``signals`` and puts the previous handlers back after.
    Python sets handlers only from the main thread; in any other the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
