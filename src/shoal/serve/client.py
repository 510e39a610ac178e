"""``PolicyClient``: the calls of the policy server's protocol from Python.

It needs only the standard library and numpy, so a simulator's process does not need torch or the
rest of shoal: one keep-alive HTTP connection per client, JSON bodies, numpy arrays sent as nested
lists (or as typed arrays with ``binary=True``, smaller and faster for images).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
from typing import Any
from urllib.parse import urlsplit

import numpy as np


class ServerError(Exception):
    """The server refused a request: ``status`` is its HTTP status, the message its reason, and
    ``retry_after_s`` (when the server sent one) when the same request may succeed."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.retry_after_s = status, retry_after_s


class PolicyClient:
    """Calls a policy server at ``address`` (``http://host:port``). ``token`` (default: the
    ``SHOAL_SERVE_TOKEN`` environment variable) is sent as a bearer token. A request refused for
    coming faster than the server's rate limit (429, refused before the server acts on it) goes
    again after the wait the server asks for, up to ``rate_retries`` times."""

    def __init__(
        self,
        address: str = "http://127.0.0.1:9900",
        token: str | None = None,
        timeout_s: float = 600.0,
        binary: bool = False,
        rate_retries: int = 3,
    ):
        parts = urlsplit(address if "://" in address else f"http://{address}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"address must look like http://host:port, got {address!r}.")
        self.host, self.port = parts.hostname, parts.port or 80
        if rate_retries < 0:
            raise ValueError(f"rate_retries must be >= 0, got {rate_retries}.")
        self.timeout_s, self.binary, self.rate_retries = timeout_s, binary, rate_retries
        token = (token if token is not None else os.environ.get("SHOAL_SERVE_TOKEN", "")).strip()
        self._headers = {"Content-Type": "application/json"}
        if token:  # (the server strips the whitespace around its own token too)
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None

    # ----- the calls ------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The server's protocol version, mode, spaces, limits and counts."""
        return self._request("GET", "/v1/info")

    def start_episode(self, episode_id: str | None = None, wait_s: float = 60.0) -> str:
        """Start an episode; returns its id (``episode_id`` when given). While every slot of the
        server holds an episode, tries again for up to ``wait_s`` seconds."""
        body = {} if episode_id is None else {"episode_id": episode_id}
        deadline = time.monotonic() + wait_s
        while True:
            try:
                # (its own loop waits out a 429 as it does a 503, within wait_s)
                return str(self._request("POST", "/v1/start_episode", body, rate_retries=0)["episode_id"])
            except ServerError as e:
                if e.retry_after_s is None or time.monotonic() + e.retry_after_s > deadline:
                    raise
                time.sleep(e.retry_after_s)

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The policy's action for ``observation``: an int for a Discrete space, an array otherwise."""
        action = self._request(
            "POST", "/v1/get_action", {"episode_id": episode_id, "observation": self._encode(observation)}
        )["action"]
        return action if isinstance(action, int) else np.asarray(action)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action the simulator chose itself for ``observation`` (off-policy)."""
        body = {"episode_id": episode_id, "observation": self._encode(observation), "action": self._encode(action)}
        self._request("POST", "/v1/log_action", body)

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Add ``reward`` to what the episode's last action earned."""
        self._request("POST", "/v1/log_returns", {"episode_id": episode_id, "reward": float(reward)})

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode at its final ``observation``; ``truncated``: cut short (a time limit), not
        a terminal state."""
        body = {"episode_id": episode_id, "observation": self._encode(observation), "truncated": bool(truncated)}
        self._request("POST", "/v1/end_episode", body)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the wire ---------------------------------------------------------------------------
    def _encode(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._encode(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return [self._encode(v) for v in value]
        if isinstance(value, (np.ndarray, np.generic)):
            if self.binary and value.ndim:
                array = np.ascontiguousarray(value)
                data = base64.b64encode(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()).decode()
                return {"dtype": array.dtype.name, "shape": list(array.shape), "data": data}
            return value.tolist()
        return value

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, rate_retries: int | None = None
    ) -> dict[str, Any]:
        payload = None if body is None else json.dumps(body).encode()
        retries = self.rate_retries if rate_retries is None else rate_retries
        for retry in range(retries + 1):
            try:
                return self._send(method, path, payload)
            except ServerError as e:
                if e.status != 429 or e.retry_after_s is None or retry == retries:
                    raise
                time.sleep(e.retry_after_s)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _send(self, method: str, path: str, payload: bytes | None) -> dict[str, Any]:
        for attempt in (0, 1):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.request(method, path, payload, self._headers)
                response = self._conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short
                self.close()
                # A kept-alive connection the server had closed (idle) answers nothing: the request
                # was not taken, so it goes once more on a new connection. Any other failure may
                # come after the server acted on it, and repeating would act twice.
                if attempt == 0 and reused and isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError)):
                    continue
                raise ConnectionError(f"policy server {self.host}:{self.port}: {e!r}") from e
            if response.will_close:
                self.close()
            try:
                result: dict[str, Any] = json.loads(data) if data else {}
            except ValueError:
                raise ServerError(response.status, f"not a shoal policy server's answer: {data[:200]!r}") from None
            if response.status != 200:
                retry = response.getheader("Retry-After")
                raise ServerError(
                    response.status, str(result.get("error", data[:200])), None if retry is None else float(retry)
                )
            return result
        raise AssertionError("unreachable")  # the loop returns or raises
