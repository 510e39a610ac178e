"""External envs: simulators that run their own loop and ask for actions, stepped as slots.

A game, robot or service cannot be stepped; it calls in (``start_episode``, ``get_action``,
``log_returns``, ``end_episode``, from the threads of a server) and waits for its action. This
backend turns those calls into the flat agent batch the collector steps: ``num_envs`` *slots*, each
holding at most one client episode at a time, in ``async_factor`` groups of equal size.

One step of a group answers every waiting ``get_action`` of its slots with one forward pass (the
batched central inference of many env workers). ``recv()`` returns a group once each slot that was
given an action has reported back (its next observation, or the end of its episode) and at least
one slot has something new; slots without an episode, or whose client has not yet asked for a
first action, ride along as padding steps. A client that does not report back within
``client_timeout_s`` has its episode closed as truncated, bootstrapped from its last observation,
so a vanished client holds its group up for at most that long.

Episodes end between steps, so the backend uses next-step autoreset: the step an episode ends
returns its final observation with the done flags, and the slot's next step is not a transition
(``valid`` False): it carries the first observation of the slot's next episode, or padding.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import EnvError, RequestError
from shoal.vector.base import Seed, StepBatch, VecBackend, batch_view

# What a slot is doing; the learner reads and the server threads change these under one lock.
IDLE = 0  # no episode, or one whose client has not yet asked for an action: a padding step
POSTED = 1  # its observation waits for the group's next step
ACTING = 2  # the learner has taken its observation and owes it an action
OWING = 3  # its client has the action; the learner waits for what happened next
ENDED = 4  # its client ended the episode; the final observation waits for the next step

POLL_S = 0.05  # how often a waiting learner looks for timed-out clients and for close()


class ExternalBackend(VecBackend):
    autoreset = "next_step"
    unsaved_state = "external clients hold their simulators' state"
    logs_actions = True
    mode = "training"

    def __init__(
        self,
        name: str,
        num_envs: int,
        obs: ObsSpec,
        act: ActionSpec,
        async_factor: int = 1,
        client_timeout_s: float = 60.0,
    ):
        if num_envs % async_factor:
            raise EnvError(f"num_envs={num_envs} slots do not split into async_factor={async_factor} equal groups.")
        super().__init__(name, num_envs, obs, act)
        self.async_factor, self.client_timeout_s = async_factor, client_timeout_s
        size = self._group_size = num_envs // async_factor
        groups = [slice(g * size, (g + 1) * size) for g in range(async_factor)]
        self._groups = [batch_view(self._buffers, r, self.batch.env_id[r], self.batch.agent_id[r]) for r in groups]
        self._lock = threading.Condition()
        self._phase = np.zeros(num_envs, dtype=np.int8)
        self._staged = np.zeros((num_envs, *obs.shape), dtype=obs.dtype)  # observations clients posted
        self._pending_reward = np.zeros(num_envs, dtype=np.float64)  # logged since the slot's last action
        self._end_truncated = np.zeros(num_envs, dtype=np.bool_)  # how an ENDED slot's episode ended
        self._deadline = np.full(num_envs, np.inf)  # when an OWING slot's client is given up on
        self._actions = np.zeros((num_envs, *act.shape), dtype=act.dtype)
        self._asking = np.zeros(num_envs, dtype=np.bool_)  # a request waits for the slot's previous end
        self._logged = np.zeros(num_envs, dtype=np.bool_)  # the posted step comes with the client's own action
        self._logged_actions = torch.zeros((num_envs, *act.shape), dtype=torch.from_numpy(self._actions).dtype)
        self.accepts_logged_actions = False
        """Whether ``log_action`` is taken: only by learners that need no probabilities of the actions
        they learn from (replay learners); an on-policy learner must choose every action itself."""
        self._answered = [threading.Event() for _ in range(num_envs)]
        self._episode: list[str | None] = [None] * num_envs  # the episode each slot holds
        self._slot_of: dict[str, int] = {}
        self._closed_why: dict[str, str] = {}  # recently closed episodes: why a late request is refused
        self._continuing = np.zeros(num_envs, dtype=np.bool_)  # the slot's last step acted on a real observation
        self._waiting = [False] * async_factor  # the collector waits for this group's next step
        self._fresh = [True] * async_factor  # reset: the group's first recv returns at once
        self._stopping = False
        self.stop_requested: Callable[[], bool] = lambda: False
        """Asked while the learner waits with no client connected: True ends the wait (KeyboardInterrupt)."""
        self.episodes_started = self.episodes_timed_out = 0
        self.batch_sizes: Counter[int] = Counter()  # clients answered by one step -> how many such steps

    # ----- the client side (server threads) ------------------------------------------------
    def start_episode(self, episode_id: str | None = None) -> str:
        """Take a free slot for a new episode; returns its id (``episode_id`` when given)."""
        with self._lock:
            self._check_open()
            episode_id = episode_id or uuid.uuid4().hex
            if episode_id in self._slot_of:
                raise RequestError(409, f"episode '{episode_id}' is already running; ids must be unique.")
            # A slot whose last episode has ended is free at once (its new episode's first request
            # waits for the step that reports the end); an idle one is preferred, in the group that
            # holds the fewest episodes, so every group has clients to step.
            free = [i for i, e in enumerate(self._episode) if e is None and self._phase[i] in (IDLE, ENDED)]
            if not free:
                raise RequestError(
                    503,
                    f"all {self.num_envs} slots hold running episodes; end one first, or serve with more num_envs.",
                    retry_after_s=1.0,
                )
            held = self._held()
            slot = min(free, key=lambda i: (held[i // self._group_size], self._phase[i] == ENDED, i))
            self._episode[slot], self._slot_of[episode_id] = episode_id, slot
            self._deadline[slot] = time.monotonic() + self.client_timeout_s  # to ask for a first action
            self._closed_why.pop(episode_id, None)
            self.episodes_started += 1
            return episode_id

    def get_action(self, episode_id: str, obs: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Post ``obs`` (already in its stored form) and wait for the action the next step of the
        slot's group gives it (as long as the learner takes: it may be updating)."""
        return self._post(episode_id, obs, None)

    def log_action(self, episode_id: str, obs: npt.NDArray[Any], action: npt.NDArray[Any]) -> None:
        """Post ``obs`` with the action the client took itself (off-policy); returns once the slot's
        step has recorded it."""
        if not self.accepts_logged_actions:
            raise RequestError(
                409,
                "this run's learner is on-policy: it learns only from actions it chose, so episodes must call "
                "get_action; log_action feeds replay learners (dqn, sac, td3).",
            )
        self._post(episode_id, obs, action)

    def _post(self, episode_id: str, obs: npt.NDArray[Any], action: npt.NDArray[Any] | None) -> npt.NDArray[Any]:
        with self._lock:
            slot = self._slot(episode_id)
            self._check_not_waiting(slot, episode_id)
            self._deadline[slot] = np.inf  # it asked: no longer a silent start
            self._asking[slot] = True
            try:
                while self._phase[slot] == ENDED:  # the slot's previous episode's end is not yet stepped
                    self._lock.wait(POLL_S)
                    self._slot(episode_id)
            finally:
                self._asking[slot] = False
            self._staged[slot] = obs
            self._logged[slot] = action is not None
            if action is not None:
                self._logged_actions[slot] = torch.as_tensor(action)
            self._phase[slot] = POSTED
            self._answered[slot].clear()
            self._lock.notify_all()
        while True:
            answered = self._answered[slot].wait(POLL_S)
            with self._lock:
                self._slot(episode_id)  # refused if the learner started over or the server closed meanwhile
                if answered and self._phase[slot] == OWING:
                    taken: npt.NDArray[Any] = self._actions[slot].copy()
                    return taken

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Add ``reward`` to what the episode's last action earned."""
        with self._lock:
            slot = self._slot(episode_id)
            if self._phase[slot] != OWING:
                raise RequestError(
                    409, f"log_returns for episode '{episode_id}' before its first action: a reward follows an action."
                )
            self._pending_reward[slot] += reward

    def end_episode(self, episode_id: str, obs: npt.NDArray[Any], truncated: bool = False) -> None:
        """End the episode with its final observation: terminated, or ``truncated`` (cut short, so
        the learner bootstraps from ``obs``). Its slot takes a new episode at once."""
        with self._lock:
            slot = self._slot(episode_id)
            self._check_not_waiting(slot, episode_id)
            if self._phase[slot] != OWING:
                self._release(slot, "it ended")  # no action taken: nothing to learn from it
                return
            self._staged[slot] = obs
            self._end_truncated[slot] = truncated
            self._phase[slot] = ENDED
            self._release(slot, "it ended")
            self._lock.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "slots": self.num_envs,
                "episodes_running": len(self._slot_of),
                "episodes_started": self.episodes_started,
                "episodes_timed_out": self.episodes_timed_out,
                "batch_sizes": dict(sorted(self.batch_sizes.items())),
            }

    def _slot(self, episode_id: str) -> int:
        self._check_open()
        slot = self._slot_of.get(episode_id)
        if slot is None:
            why = self._closed_why.get(episode_id)
            raise RequestError(
                404,
                f"episode '{episode_id}' " + (f"is closed: {why}." if why else "is unknown; call start_episode first."),
            )
        return slot

    def _held(self) -> list[int]:
        """Episodes each group's slots hold."""
        held = [0] * self.async_factor
        for slot, episode in enumerate(self._episode):
            held[slot // self._group_size] += episode is not None
        return held

    def _check_not_waiting(self, slot: int, episode_id: str) -> None:
        if self._phase[slot] in (POSTED, ACTING) or self._asking[slot]:
            raise RequestError(
                409, f"episode '{episode_id}' is waiting for an action; one request at a time per episode."
            )

    def _release(self, slot: int, why: str) -> None:
        episode_id = self._episode[slot]
        if episode_id is not None:
            del self._slot_of[episode_id]
            self._closed_why[episode_id] = why
            if len(self._closed_why) > 4 * self.num_envs:  # remember only recent ones
                self._closed_why.pop(next(iter(self._closed_why)))
        self._episode[slot] = None

    def _check_open(self) -> None:
        if self._stopping:
            raise RequestError(503, "the server is shutting down.")

    # ----- the learner side ----------------------------------------------------------------
    def reset(self, seed: Seed = None) -> None:
        """Start with every slot empty (before the server takes requests, or after a checkpoint is
        loaded). The clients run their own episodes, so no learner may restart them."""
        with self._lock:
            if self._slot_of:
                raise EnvError(
                    f"env '{self.name}': the learner restarted every env while simulators held {len(self._slot_of)} "
                    f"episodes; an algorithm that restarts its envs each iteration (GRPO) cannot train on "
                    f"external simulators: serve ppo, dqn, sac or td3."
                )
            self._phase[:] = IDLE
            self._continuing[:] = False
            self._pending_reward[:] = 0.0
            self._deadline[:] = np.inf
            self._waiting = [False] * self.async_factor
            self._fresh = [True] * self.async_factor

    def recv(self) -> StepBatch:
        with self._lock:
            while True:
                self._check_open_learner()
                self._time_out_clients()
                # a fresh group first, then one with news, then one stepping as padding
                priority, g = max((self._priority(g), -g) for g in range(self.async_factor))
                if priority:
                    batch = self._groups[-g]
                    self._fresh[-g] = self._waiting[-g] = False
                    self._write_step(batch.rows)
                    self._lock.notify_all()  # new episodes may wait for their slot's previous end
                    return batch
                if not self._slot_of and self.stop_requested():
                    raise KeyboardInterrupt  # asked to stop, and no client is there to finish the step
                self._lock.wait(POLL_S)

    def _priority(self, group: int) -> int:
        if self._fresh[group]:
            return 3
        return self._ready(self._groups[group].rows) if self._waiting[group] else 0

    def logged(self, actions: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """``actions`` of the batch's rows, with the actions clients took themselves in their rows."""
        rows = batch.rows
        with self._lock:
            logged = self._logged[rows] & (self._phase[rows] == ACTING)
            if logged.any():
                at = torch.from_numpy(logged)
                actions[at] = self._logged_actions[rows][at].to(actions.dtype)
        return actions

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        rows = self.batch.rows if batch is None else batch.rows
        taken = self.env_actions(actions)
        with self._lock:
            acting = np.flatnonzero(self._phase[rows] == ACTING) + rows.start
            self._actions[acting] = taken[acting - rows.start]
            self._phase[acting] = OWING
            self._deadline[acting] = time.monotonic() + self.client_timeout_s
            for slot in acting:
                self._answered[slot].set()
            if len(acting):
                self.batch_sizes[len(acting)] += 1
            for g in range(rows.start // self._group_size, -(-rows.stop // self._group_size)):
                self._waiting[g] = True  # its next step is owed (every group, when sent all rows at once)

    def _ready(self, rows: slice) -> int:
        """2 when every slot given an action has reported back and one has something new; 1 when
        the group holds no episode while others do (it steps as padding, so it does not hold up the
        rollout); else 0."""
        phase = self._phase[rows]
        if (phase == OWING).any():
            return 0
        if ((phase == POSTED) | (phase == ENDED)).any():
            return 2
        return int(self._held()[rows.start // self._group_size] == 0 and bool(self._slot_of))

    def _write_step(self, rows: slice) -> None:
        """The group's step result into the shared buffers; slots that report turn to ACTING."""
        phase = self._phase[rows]
        posted, ended = phase == POSTED, phase == ENDED
        reported = posted | ended
        # a slot whose previous step was padding (or an episode's end) makes no transition now
        continuing = self._continuing[rows] & reported
        self._obs[rows][reported] = self._staged[rows][reported]
        self._obs[rows][~reported] = 0
        self._reward[rows] = np.where(continuing, self._pending_reward[rows], 0.0)
        self._terminated[rows] = continuing & ended & ~self._end_truncated[rows]
        self._truncated[rows] = continuing & ended & self._end_truncated[rows]
        self._valid[rows] = continuing
        self._pending_reward[rows] = 0.0
        self._phase[rows] = np.where(posted, ACTING, IDLE)
        self._continuing[rows] = posted

    def _time_out_clients(self) -> None:
        """Close the episodes whose clients have not reported back in time, as truncated at their
        last observation (the learner bootstraps from it), and free the slots of episodes started
        but never acted in."""
        now = time.monotonic()
        late = np.flatnonzero((self._phase == OWING) & (self._deadline < now))
        silent = np.flatnonzero((self._phase == IDLE) & (self._deadline < now))
        for slot in silent:
            if self._episode[slot] is not None:
                self._release(int(slot), f"it asked for no action for {self.client_timeout_s:g} s after it started")
                self.episodes_timed_out += 1
            self._deadline[slot] = np.inf
        for slot in late:
            self._end_truncated[slot] = True
            self._phase[slot] = ENDED  # _staged still holds the observation it acted on
            self._release(int(slot), f"its client sent nothing for {self.client_timeout_s:g} s")
            self.episodes_timed_out += 1

    def _check_open_learner(self) -> None:
        if self._stopping:
            raise EnvError(f"env '{self.name}': the server of the external envs closed.")

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Envs stepped elsewhere (a run with local envs, resumed as served) cannot be put back."""
        return False

    def close(self) -> None:
        """Refuse new requests and release every waiting client."""
        with self._lock:
            self._stopping = True
            for event in self._answered:
                event.set()
            self._lock.notify_all()
