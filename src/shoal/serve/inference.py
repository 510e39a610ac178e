"""Serving a trained policy: clients' ``get_action`` calls batched into one forward pass.

A batch forms from the first waiting request: it waits at most ``max_wait_ms`` for more, and no
longer once every running episode is waiting or ``max_batch`` are, then one forward pass answers
them all. Each episode keeps its
row of the policy's state (a recurrent policy remembers the episode), reset at its first action.
Nothing is learned: ``log_action`` and ``log_returns`` are checked and counted, so a client
written for a training server runs unchanged.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from shoal.errors import RequestError
from shoal.models.policy import Policy
from shoal.vector.base import VecBackend


class InferenceSession:
    mode = "inference"

    def __init__(
        self,
        policy: Policy,
        backend: VecBackend,
        max_episodes: int = 1024,
        max_batch: int = 256,
        max_wait_ms: float = 2.0,
        deterministic: bool = True,
        client_timeout_s: float = 600.0,
    ):
        """``backend``: where the spaces and the env's action clipping come from (never stepped)."""
        self.policy, self.backend = policy, backend
        self.obs_spec, self.act_spec = backend.obs_spec, backend.act_spec
        self.max_batch, self.max_wait_s, self.deterministic = max_batch, max_wait_ms / 1e3, deterministic
        self.client_timeout_s = client_timeout_s
        self.state = policy.initial_state(max_episodes)
        self.first = torch.ones(max_episodes, dtype=torch.bool)
        self._obs = torch.from_numpy(np.zeros((max_batch, *self.obs_spec.shape), dtype=self.obs_spec.dtype))
        self._lock = threading.Condition()
        self._free = list(range(max_episodes - 1, -1, -1))
        self._row_of: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._waiting: list[tuple[int, npt.NDArray[Any], list[Any]]] = []  # (row, obs, [action or None])
        self._busy: set[int] = set()  # rows with a request waiting or being answered
        self._closed = False
        self.batch_sizes: Counter[int] = Counter()
        self.episodes_started = 0
        self._thread = threading.Thread(target=self._serve_batches, name="shoal-inference", daemon=True)
        self._thread.start()

    def start_episode(self, episode_id: str | None = None) -> str:
        with self._lock:
            self._forget_silent()
            episode_id = episode_id or uuid.uuid4().hex
            if episode_id in self._row_of:
                raise RequestError(409, f"episode '{episode_id}' is already running; ids must be unique.")
            if not self._free:
                raise RequestError(503, f"{len(self._row_of)} episodes are running, the most this server holds.")
            row = self._free.pop()
            self._row_of[episode_id], self._last_seen[episode_id] = row, time.monotonic()
            # a fresh state, not only `first`: a gSDE policy keeps its row's noise matrix across
            # episode starts (it redraws per collection, which a server has not), so each episode
            # draws its own here
            if not self.state.is_empty():  # type: ignore[no-untyped-call]
                self.state[row] = self.policy.initial_state(1)[0]
            self.first[row] = True
            self.episodes_started += 1
            return episode_id

    def get_action(self, episode_id: str, obs: npt.NDArray[Any]) -> npt.NDArray[Any]:
        answer: list[Any] = [None]
        with self._lock:
            row = self._idle_row(episode_id)
            self._busy.add(row)
            self._waiting.append((row, obs, answer))
            self._lock.notify_all()
            while answer[0] is None:
                if self._closed:
                    raise RequestError(503, "the server is shutting down.")
                self._lock.wait(0.05)
        if isinstance(answer[0], Exception):
            raise answer[0]
        taken: npt.NDArray[Any] = answer[0]
        return taken

    def log_action(self, episode_id: str, obs: npt.NDArray[Any], action: npt.NDArray[Any]) -> None:
        with self._lock:
            self._row(episode_id)

    def log_returns(self, episode_id: str, reward: float) -> None:
        with self._lock:
            row = self._row(episode_id)
            if "prev_reward" in self.state.keys():  # noqa: SIM118 (a core that reads the previous reward)
                self.state["prev_reward"][row] += reward  # the rewards since the last action add up

    def end_episode(self, episode_id: str, obs: npt.NDArray[Any], truncated: bool = False) -> None:
        with self._lock:
            self._idle_row(episode_id)
            self._drop(episode_id)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "episodes_running": len(self._row_of),
                "episodes_started": self.episodes_started,
                "batch_sizes": dict(sorted(self.batch_sizes.items())),
            }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _row(self, episode_id: str) -> int:
        if self._closed:
            raise RequestError(503, "the server is shutting down.")
        row = self._row_of.get(episode_id)
        if row is None:
            raise RequestError(404, f"episode '{episode_id}' is unknown or ended; call start_episode first.")
        self._last_seen[episode_id] = time.monotonic()
        return row

    def _idle_row(self, episode_id: str) -> int:
        """The episode's row, which must not be waiting for (or getting) an action."""
        row = self._row(episode_id)
        if row in self._busy:
            raise RequestError(
                409, f"episode '{episode_id}' is waiting for an action; one request at a time per episode."
            )
        return row

    def _drop(self, episode_id: str) -> None:
        self._free.append(self._row_of.pop(episode_id))
        del self._last_seen[episode_id]

    def _forget_silent(self) -> None:
        """Episodes whose clients have sent nothing for ``client_timeout_s`` give their rows back."""
        cutoff = time.monotonic() - self.client_timeout_s
        for episode_id in [e for e, seen in self._last_seen.items() if seen < cutoff]:
            if self._row_of[episode_id] not in self._busy:
                self._drop(episode_id)

    @torch.inference_mode()
    def _serve_batches(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait(0.05)
                if self._closed:
                    return
                # more requests may come, unless every running episode is waiting already
                deadline = time.monotonic() + self.max_wait_s
                while len(self._waiting) < min(self.max_batch, len(self._row_of)):
                    if (left := deadline - time.monotonic()) <= 0:
                        break
                    self._lock.wait(left)
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            try:
                answers: Any = self._act(batch)
            except Exception as e:  # a policy that fails on some input: those clients hear why, the server goes on
                answers = [RequestError(500, f"the policy failed: {type(e).__name__}: {e}") for _ in batch]
            with self._lock:
                for (row, _, answer), given in zip(batch, answers):
                    answer[0] = given
                    self._busy.discard(row)
                self.batch_sizes[len(batch)] += 1
                self._lock.notify_all()

    def _act(self, batch: list[tuple[int, npt.NDArray[Any], list[Any]]]) -> list[npt.NDArray[Any]]:
        """One forward pass over the batch's observations, each from its episode's state."""
        rows = torch.tensor([row for row, _, _ in batch])
        obs = self._obs[: len(batch)]
        for i, (_, o, _) in enumerate(batch):
            obs[i] = torch.from_numpy(o)
        action, _, next_state = self.policy.act(
            obs, self.state[rows], self.first[rows], deterministic=self.deterministic
        )
        if not next_state.is_empty():  # type: ignore[no-untyped-call]
            self.state[rows] = next_state
        self.first[rows] = False
        actions = self.backend.env_actions(action)
        return [actions[i].copy() for i in range(len(batch))]
