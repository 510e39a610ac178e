"""The policy server: external simulators' calls over HTTP, answered by a training run or a
trained checkpoint.

The standard library's threading HTTP server carries the requests (one thread per connection,
keep-alive), behind the limits a server facing other programs needs: it binds 127.0.0.1 unless
told otherwise and then requires a bearer token, bounds the body size, the connections and each
connection's request rate, and times out idle or slow connections. Every refused request gets a
4xx with a JSON reason; no request can stop the server or touch another client's episodes.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import ConfigError
from shoal.serve import protocol
from shoal.serve.protocol import field
from shoal.vector.external import ClientError

DEFAULT_PORT = 9900


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


class PolicyServer:
    """Serves ``session`` on ``host:port`` (port 0: any free one; ``address`` tells which) from a
    background thread, until ``close()``.

    Binding anywhere but loopback needs ``token``: clients then send ``Authorization: Bearer
    <token>``. ``max_body_bytes`` bounds a request, ``max_connections`` the open connections (more
    are refused with 503), ``max_requests_per_s`` each connection's rate (429 past it), and
    ``idle_timeout_s`` how long a connection may sit idle or trickle a request."""

    def __init__(
        self,
        session: Session,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str | None = None,
        max_body_bytes: int = 1 << 20,
        max_connections: int = 256,
        max_requests_per_s: float = 1000.0,
        idle_timeout_s: float = 30.0,
    ):
        if token is None and not is_loopback(host):
            raise ConfigError(
                f"serving on host '{host}' exposes the policy server beyond this machine; give it a token "
                f"(--token or SHOAL_SERVE_TOKEN), which clients send as 'Authorization: Bearer <token>'."
            )
        if token is not None and len(token) < 16:
            raise ConfigError(
                f"the server token is {len(token)} characters; use at least 16 (e.g. from `openssl rand -hex 16`)."
            )
        self.session = session
        self.limits = {"max_body_bytes": max_body_bytes, "max_requests_per_s": max_requests_per_s}
        handler = type("Handler", (_Handler,), {"server_ref": self, "timeout": idle_timeout_s})
        try:
            self._http = _HTTPServer((host, port), handler)
        except OSError as e:
            raise ConfigError(f"cannot serve on {host}:{port}: {e.strerror or e}; choose another --port.") from None
        self._token = None if token is None else token.encode()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
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
        self._thread = threading.Thread(target=self._http.serve_forever, name="shoal-serve", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting requests; waiting clients are answered 503."""
        close = getattr(self.session, "close", None)
        if close is not None:
            close()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the routes ---------------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def call(self, route: str, data: dict[str, Any]) -> dict[str, Any]:
        """Answer one POST route; ClientError for what the client got wrong."""
        s = self.session
        if route not in ROUTES:
            raise ClientError(404, f"no route '/v1/{route}'; the routes are {', '.join('/v1/' + r for r in ROUTES)}.")
        if route == "start_episode":
            return {"episode_id": s.start_episode(field(data, "episode_id", str, None))}
        episode_id = field(data, "episode_id", str)
        if route == "get_action":
            obs = s.get_action(episode_id, self._obs(data))
            return {"action": protocol.encode_action(obs)}
        if route == "log_action":
            taken = protocol.action(field(data, "action", (int, list, dict)), s.act_spec)
            s.log_action(episode_id, self._obs(data), taken)
            return {}
        if route == "log_returns":
            reward = field(data, "reward", (int, float))
            if not -1e30 < reward < 1e30:
                raise ClientError(400, f"'reward' must be a finite number, got {reward}.")
            s.log_returns(episode_id, float(reward))
            return {}
        s.end_episode(episode_id, self._obs(data), bool(field(data, "truncated", bool, False)))  # route: end_episode
        return {}

    def _obs(self, data: dict[str, Any]) -> npt.NDArray[Any]:
        spec = self.session.obs_spec
        out = np.empty(spec.shape, dtype=spec.dtype)
        return protocol.observation(field(data, "observation", (int, float, list, dict)), spec, out)

    def describe(self) -> dict[str, Any]:
        """What GET /v1/info answers: the protocol, the mode, the spaces, the limits and counts."""
        s = self.session
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "mode": s.mode,
            "observation_space": protocol.describe_space(s.obs_spec.space),
            "action_space": protocol.describe_space(s.act_spec.space),
            "auth": self._token is not None,
            "limits": self.limits,
            "stats": {"requests": self.requests, "refused": dict(self.refused), **s.stats()},
        }


ROUTES = ("start_episode", "get_action", "log_action", "log_returns", "end_episode")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connecting at once must not be refused by the backlog
    block_on_close = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client
    disable_nagle_algorithm = True  # small replies go out at once, not after the peer's delayed ACK
    server_ref: PolicyServer
    server_version = "shoal"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self._admitted = self.server_ref._slots.acquire(blocking=False)
        self._rate = self.server_ref.limits["max_requests_per_s"]
        self._tokens, self._refilled = self._rate, time.monotonic()  # a burst of one second's worth

    def finish(self) -> None:
        super().finish()
        if self._admitted:
            self.server_ref._slots.release()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the training progress

    def do_GET(self) -> None:
        if not self._admit():
            return
        if self.path.rstrip("/") == "/v1/info":
            self._reply(200, self.server_ref.describe())
        else:
            self._error(404, f"no route GET {self.path}; GET /v1/info describes the server.")

    def do_POST(self) -> None:
        if not self._admit():
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._error(411, "a POST needs a Content-Length header (chunked bodies are not accepted).", close=True)
            return
        size, limit = int(length), self.server_ref.limits["max_body_bytes"]
        if size > limit:
            self._error(413, f"the body is {size} bytes; this server accepts at most {limit}.", close=True)
            return
        try:
            body = self.rfile.read(size)
        except TimeoutError:
            self.close_connection = True
            return
        if not self.path.startswith("/v1/"):
            self._error(404, f"no route {self.path}; this server speaks protocol version 1 under /v1/.")
            return
        try:
            result = self.server_ref.call(self.path[4:].rstrip("/"), protocol.parse_body(body))
        except ClientError as e:
            retry = None if e.retry_after_s is None else {"Retry-After": str(max(1, round(e.retry_after_s)))}
            self._error(e.status, str(e), headers=retry)
            return
        except Exception as e:  # a bug of the server: answered, reported, and the server goes on
            traceback.print_exc(file=sys.stderr)
            self._error(500, f"the server failed on this request: {type(e).__name__}: {e}")
            return
        self._reply(200, result)

    def _admit(self) -> bool:
        """Refuse (and count) requests over the connection, token and rate limits."""
        self.server_ref.requests += 1
        if not self._admitted:
            self._error(503, "the server has too many open connections; try again later.", close=True)
            return False
        if not self.server_ref.authorized(self.headers.get("Authorization")):
            self._error(401, "missing or wrong token: send 'Authorization: Bearer <token>'.", close=True)
            return False
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1.0:
            self._error(
                429,
                f"more than {self._rate:g} requests per second on this connection; slow down.",
                headers={"Retry-After": "1"},
            )
            return False
        self._tokens -= 1.0
        return True

    def _error(self, status: int, message: str, close: bool = False, headers: dict[str, str] | None = None) -> None:
        refused = self.server_ref.refused
        refused[status] = refused.get(status, 0) + 1
        if close:
            self.close_connection = True
        self._reply(status, {"error": message, "status": status, "reason": HTTPStatus(status).phrase}, headers)

    def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client went away
            self.close_connection = True
