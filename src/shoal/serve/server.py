"""The policy server: external simulators' calls over HTTP, answered by a training run or a
trained checkpoint.

The standard library's threading HTTP server carries the requests (one thread per connection,
keep-alive), behind the limits a server facing other programs needs: it binds 127.0.0.1 unless
told otherwise and then requires a bearer token, bounds the body size, the connections and each
connection's request rate, and closes idle or slow connections. Every refused request gets a 4xx
(or 503) with a JSON reason and changes nothing; no request can stop the server.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import ipaddress
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import ConfigError, RequestError
from shoal.serve import protocol
from shoal.serve.connections import BoundedHTTPServer, json_response, log
from shoal.serve.protocol import field

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9900
MIN_TOKEN_CHARS = 16
MAKE_A_TOKEN = 'make one with `openssl rand -hex 16` or `python -c "import secrets; print(secrets.token_hex(16))"`'


class Session(Protocol):
    """What answers the calls: the external-env backend of a training run, or an inference session."""

    mode: str  # "training" or "inference"
    obs_spec: ObsSpec
    act_spec: ActionSpec

    def start_episode(self, episode_id: str | None = None) -> str: ...
    def get_action(self, episode_id: str, obs: npt.NDArray[Any]) -> npt.NDArray[Any]: ...
    def log_action(self, episode_id: str, obs: npt.NDArray[Any], action: npt.NDArray[Any]) -> None: ...
    def log_returns(self, episode_id: str, reward: float) -> None: ...
    def end_episode(self, episode_id: str, obs: npt.NDArray[Any], truncated: bool = False) -> None: ...
    def stats(self) -> dict[str, Any]: ...


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_access(host: str, token: str | None) -> str | None:
    """The token a server on ``host`` requires (None: none), as given but for the whitespace around
    it, which clients' tokens lose too. A ConfigError, saying what is wrong and how to make a good
    token, for a server beyond this machine without one, and for a token that is easy to guess or
    cannot travel in an HTTP header. The message never shows the token: it is a secret."""
    if token is None:
        if not is_loopback(host):
            raise ConfigError(
                f"serving on host '{host}' exposes the policy server beyond this machine; give it a token "
                f"(--token or SHOAL_SERVE_TOKEN), which clients send as 'Authorization: Bearer <token>': "
                f"{MAKE_A_TOKEN}."
            )
        return None
    token = token.strip()
    if not token:
        problem = "is empty or only whitespace"
    elif len(token) < MIN_TOKEN_CHARS:
        problem = f"is {len(token)} characters, not counting whitespace around it; use at least {MIN_TOKEN_CHARS}"
    elif len(set(token)) == 1:
        problem = f"is one character repeated {len(token)} times, which anyone can guess"
    elif not (token.isascii() and token.isprintable()):
        problem = "holds characters other than printable ASCII, which an HTTP header does not carry"
    else:
        return token
    raise ConfigError(f"the server token {problem}; {MAKE_A_TOKEN}.")


class PolicyServer:
    """Serves ``session`` on ``host:port`` (port 0: any free one; ``address`` tells which) from a
    background thread, until ``close()``.

    Binding anywhere but loopback needs ``token`` (``check_access`` says which tokens are strong
    enough): clients then send ``Authorization: Bearer <token>``. ``max_body_bytes`` bounds a
    request, ``max_connections`` the open connections (more are answered 503 and closed before any
    thread is started for them), ``max_requests_per_s`` each connection's rate (429 past it), and
    ``idle_timeout_s`` how long a connection may take to send a whole request, or wait between
    requests, before it is closed."""

    def __init__(
        self,
        session: Session,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        max_body_bytes: int = 1 << 20,
        max_connections: int = 256,
        max_requests_per_s: float = 5000.0,
        idle_timeout_s: float = 30.0,
    ):
        required = check_access(host, token)
        if not idle_timeout_s > 0 or not max_connections >= 1 or not max_requests_per_s > 0 or not max_body_bytes >= 1:
            raise ConfigError(
                "idle_timeout_s and max_requests_per_s must be > 0, max_connections and max_body_bytes >= 1; got "
                f"{idle_timeout_s}, {max_requests_per_s}, {max_connections}, {max_body_bytes}."
            )
        self.session = session
        self.limits = {"max_body_bytes": max_body_bytes, "max_requests_per_s": max_requests_per_s}
        self.idle_timeout_s = idle_timeout_s
        handler = type("Handler", (_Handler,), {"server_ref": self, "timeout": idle_timeout_s})
        try:
            self._http = BoundedHTTPServer((host, port), handler, max_connections, self._count)
        except OSError as e:
            raise ConfigError(f"cannot serve on {host}:{port}: {e.strerror or e}; choose another --port.") from None
        self._token = None if required is None else required.encode()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._reading: dict[_Handler, float] = {}  # connections reading a request -> since when
        self._closed = threading.Event()
        self.requests = 0
        self.refused: dict[int, int] = {}  # status -> count of refused requests

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._http.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> PolicyServer:
        # the HTTP loop looks for a shutdown every 0.05 s (socketserver's default is 0.5 s), so that
        # close() returns at once: a waking loop costs nothing beside the requests it serves
        serve = functools.partial(self._http.serve_forever, poll_interval=0.05)
        for target, name in ((serve, "shoal-serve"), (self._close_slow, "shoal-serve-reaper")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        """Stop accepting requests; waiting clients are answered 503."""
        close = getattr(self.session, "close", None)
        if close is not None:
            close()
        self._closed.set()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- connections ----------------------------------------------------------------------
    def _count(self, status: int | None) -> None:
        """Count a request, refused with ``status`` unless None."""
        with self._lock:
            self.requests += 1
            if status is not None:
                self.refused[status] = self.refused.get(status, 0) + 1

    def reading(self, handler: _Handler, since: float | None) -> None:
        """``handler``'s connection started reading a request at ``since`` (None: it has read it)."""
        with self._lock:
            if since is None:
                self._reading.pop(handler, None)
            else:
                self._reading[handler] = since

    def _close_slow(self) -> None:
        """Close the connections that have been idle, or sending one request, for longer than
        ``idle_timeout_s``: a client trickling bytes cannot hold a connection (or a thread) forever."""
        while not self._closed.wait(min(1.0, self.idle_timeout_s / 4)):
            cutoff = time.monotonic() - self.idle_timeout_s
            with self._lock:  # under the lock: a handler that has just read its request is not dropped
                for handler in [h for h, since in self._reading.items() if since < cutoff]:
                    handler.drop()
                    del self._reading[handler]
            self._http.close_refused()

    # ----- the routes ---------------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def call(self, route: str, data: dict[str, Any], bools: bool = True) -> dict[str, Any]:
        """Answer one POST route; RequestError for what the client got wrong. ``bools``: whether
        ``data`` may hold a bool (``protocol.parse_body`` tells)."""
        s = self.session
        if route not in ROUTES:
            raise RequestError(404, f"no route '/v1/{route}'; the routes are {', '.join('/v1/' + r for r in ROUTES)}.")
        if route == "start_episode":
            given = field(data, "episode_id", str, None)
            return {"episode_id": s.start_episode(None if given is None else protocol.episode_id(given))}
        episode_id = protocol.episode_id(field(data, "episode_id", str))
        if route == "get_action":
            action = s.get_action(episode_id, self._obs(data, bools))
            return {"action": protocol.encode_action(action)}
        if route == "log_action":
            taken = protocol.action(field(data, "action", (int, float, list, dict)), s.act_spec, bools)
            s.log_action(episode_id, self._obs(data, bools), taken)
            return {}
        if route == "log_returns":
            s.log_returns(episode_id, protocol.reward(field(data, "reward", (int, float))))
            return {}
        s.end_episode(episode_id, self._obs(data, bools), bool(field(data, "truncated", bool, False)))  # end_episode
        return {}

    def _obs(self, data: dict[str, Any], bools: bool) -> npt.NDArray[Any]:
        spec = self.session.obs_spec
        out = np.empty(spec.shape, dtype=spec.dtype)
        return protocol.observation(field(data, "observation", (int, float, list, dict)), spec, out, bools)

    def describe(self) -> dict[str, Any]:
        """What GET /v1/info answers: the protocol, the mode, the spaces, the limits and counts."""
        s = self.session
        with self._lock:
            counts = {"requests": self.requests, "refused": dict(self.refused)}
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "mode": s.mode,
            "observation_space": protocol.describe_space(s.obs_spec.space),
            "action_space": protocol.describe_space(s.act_spec.space),
            "auth": self._token is not None,
            "limits": self.limits,
            "stats": {**counts, **s.stats()},
        }


ROUTES = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client
    disable_nagle_algorithm = True  # small replies go out at once, not after the peer's delayed ACK
    server_ref: PolicyServer
    server_version = "shoal"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self._rate = self.server_ref.limits["max_requests_per_s"]
        self._tokens, self._refilled = self._rate, time.monotonic()  # a burst of one second's worth

    def handle_one_request(self) -> None:
        self.server_ref.reading(self, time.monotonic())  # from here until its body is read
        try:
            super().handle_one_request()
        finally:
            self.server_ref.reading(self, None)

    def drop(self) -> None:
        """Close the connection under the reading thread (it was too slow)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long) as JSON, closing."""
        self._error(code, message or HTTPStatus(code).phrase, close=True)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the training progress

    def do_GET(self) -> None:
        self.server_ref.reading(self, None)
        if not self._admit():
            return
        if self.path.rstrip("/") == "/v1/info":
            self.server_ref._count(None)
            self._reply(200, self.server_ref.describe())
        else:
            self._error(404, f"no route GET {self.path}; GET /v1/info describes the server.")

    def do_POST(self) -> None:
        if not self._admit(close=True):  # its body is not read: the connection cannot go on
            return
        length = self.headers.get("Content-Length", "")
        size = int(length) if length.isascii() and length.isdigit() and len(length) < 16 else None
        if size is None:
            self._error(411, "a POST needs a Content-Length header of digits (chunked bodies are not accepted).", True)
            return
        limit = self.server_ref.limits["max_body_bytes"]
        if size > limit:
            self._error(413, f"the body is {size} bytes; this server accepts at most {limit}.", close=True)
            return
        try:
            body = self.rfile.read(size)
        except OSError:  # timed out or dropped while trickling
            self.close_connection = True
            return
        self.server_ref.reading(self, None)
        if len(body) < size:
            self.close_connection = True
            return
        if not self.path.startswith("/v1/"):
            self._error(404, f"no route {self.path}; this server speaks protocol version 1 under /v1/.")
            return
        try:
            result = self.server_ref.call(self.path[4:].rstrip("/"), *protocol.parse_body(body))
        except RequestError as e:
            retry = None if e.retry_after_s is None else {"Retry-After": str(max(1, round(e.retry_after_s)))}
            self._error(e.status, str(e), headers=retry)
            return
        except Exception as e:  # a bug of the server: answered, reported, and the server goes on
            log.exception("shoal: policy server: %s failed", self.path)
            self._error(500, f"the server failed on this request: {type(e).__name__}: {e}")
            return
        self.server_ref._count(None)
        self._reply(200, result)

    def _admit(self, close: bool = False) -> bool:
        """Refuse (and count) requests without the token or over the rate; ``close``: a refused
        request's connection closes (its body was not read)."""
        if not self.server_ref.authorized(self.headers.get("Authorization")):
            self._error(401, "missing or wrong token: send 'Authorization: Bearer <token>'.", close=True)
            return False
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1.0:
            message = f"more than {self._rate:g} requests per second on this connection; slow down."
            self._error(429, message, close, headers={"Retry-After": "1"})
            return False
        self._tokens -= 1.0
        return True

    def _error(self, status: int, message: str, close: bool = False, headers: dict[str, str] | None = None) -> None:
        self.server_ref._count(status)
        if close:
            self.close_connection = True
        self._reply(status, {"error": message, "status": status}, headers)

    def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        try:
            self.wfile.write(json_response(status, payload, self.close_connection, headers))
        except OSError:  # the client went away
            self.close_connection = True
