"""The policy server's connections: the threading HTTP server that bounds them, the JSON answers
written on them, and the log of what goes wrong on them.

A client that crashes, or loses its network, resets its connection in the middle of a request.
That is the client's trouble, not the server's, and a server with many clients sees it often:
each is one log line (client address and error), at most one line per kind of error every
``interval_s``, the next line counting those left out, where the standard library would print a
traceback for each. Any other exception in a handler is a bug of the server, logged with its
traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections import Counter
from email.utils import formatdate
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("shoal.serve")

# what a client's dropped or stalled connection raises: reset, aborted, broken pipe; timed out
CLIENT_ERRORS = (ConnectionError, TimeoutError)


def client_name(client_address: Any) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a connection's peer."""
    host, port = client_address[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class ClientErrorLog:
    """Logs clients' network errors: one line per kind of error per ``interval_s`` at most, and the
    next line of that kind says how many were left out meanwhile."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self._lock = threading.Lock()  # handler threads report at once
        self._logged_at: dict[str, float] = {}  # kind of error -> when its last line was logged
        self._left_out: Counter[str] = Counter()  # kind of error -> errors not logged since then

    def report(self, error: BaseException, client_address: Any) -> None:
        kind, now = type(error).__name__, time.monotonic()
        with self._lock:
            last = self._logged_at.get(kind)
            if last is not None and now - last < self.interval_s:
                self._left_out[kind] += 1
                return
            self._logged_at[kind] = now
            left_out = self._left_out.pop(kind, 0)
        more = f" ({left_out} more since the last such line)" if left_out else ""
        log.warning(
            "shoal: policy server: the connection of client %s failed (%s) and is closed%s",
            client_name(client_address),
            kind,
            more,
        )


def json_response(status: int, payload: dict[str, Any], close: bool, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response with ``payload`` as its JSON body."""
    body = json.dumps(payload).encode()
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Date: {formatdate(usegmt=True)}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, for at most ``max_connections`` at once; ``count(status)`` counts
    the connections refused for being one too many."""

    daemon_threads = True
    request_queue_size = 256  # many clients connecting at once must not be refused by the backlog
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int, count: Any):
        self._slots = threading.BoundedSemaphore(max_connections)
        self._count = count
        self._refused: list[tuple[socket.socket, float]] = []  # answered 503, closed a little later
        self.client_errors = ClientErrorLog()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A connection over the limit is answered 503 here, before a thread is made for it. Its
        socket closes a second later (``close_refused``), once the client has sent its request and
        read the answer: closing at once would reset the connection under it."""
        if not self._slots.acquire(blocking=False):
            self._count(503)
            with contextlib.suppress(OSError):
                reply = {"error": "the server has too many open connections; try again later.", "status": 503}
                request.sendall(json_response(503, reply, close=True, headers={"Retry-After": "1"}))
                request.shutdown(socket.SHUT_WR)
            self._refused.append((request, time.monotonic() + 1.0))
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started to give the slot back
            self._slots.release()
            raise

    def close_refused(self) -> None:
        """Close the refused connections whose second is up (called by the reaper)."""
        now, keep = time.monotonic(), []
        for request, when in list(self._refused):
            if when <= now:
                self.shutdown_request(request)
            else:
                keep.append((request, when))
        self._refused = keep

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An exception out of a connection's handler: a client's network error is one
        rate-limited line; anything else is a bug, logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, CLIENT_ERRORS):
            self.client_errors.report(error, client_address)
        else:
            log.error("shoal: policy server: the connection of %s failed", client_name(client_address), exc_info=True)
