"""Multiprocessing backend: worker processes step envs into shared memory (seeds 001 and 003).

``num_workers`` processes each run a ``SerialBackend`` over its slice of the flat-batch arrays.
The arrays live in anonymous shared memory mapped before the workers are forked, so the main
process reads them as torch tensors with no copies, and no named segment exists that a crash
could leak. Only one-byte commands cross the pipes on the hot path; infos travel (pickled)
only when an env sets them at an episode's end, and errors travel with their traceback.

Async batches: the workers form ``async_factor`` groups. ``recv()`` returns the first group whose
workers have all finished stepping (its rows and env ids are in the batch), and
``send(actions, batch)`` starts that group stepping again, so the policy's forward for one group
overlaps the stepping of the others. With ``async_factor=1`` there is one group: synchronous.

Workers are forked: envs and their factories need not be picklable, and start-up is fast.
Workers never run torch ops (the main process clips actions), so they are safe to fork from a
process that has used torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn, cast

import numpy as np
import numpy.typing as npt
import torch

from shoal.errors import EnvError
from shoal.vector.agents import AgentEnvBackend
from shoal.vector.base import (
    Buffers,
    EnvStepError,
    Seed,
    StepBatch,
    VecBackend,
    allocate_buffers,
    batch_view,
    env_seeds,
)
from shoal.vector.serial import RESTART_SEED_STRIDE, SerialBackend

# what each worker runs over its envs: a serial backend of gym envs or of multi-agent adapters
SerialClass = Callable[..., SerialBackend | AgentEnvBackend]

# one-byte commands and replies
_STEP, _RESET, _CLOSE = b"s", b"r", b"c"
_OK, _EVENTS, _ERROR = b"k", b"i", b"e"


def _shared_array(shape: tuple[int, ...], dtype: npt.DTypeLike, maps: list[mmap.mmap]) -> npt.NDArray[Any]:
    """A zeroed array in anonymous shared memory, inherited by processes forked after it."""
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    maps.append(buf)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _die_with_parent() -> None:
    """Ask Linux to kill this worker if the main process dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _worker(
    serial_class: SerialClass,
    make_env: Callable[[int], Any],
    first_env: int,
    num_envs: int,
    name: str,
    buffers: Buffers,
    actions: npt.NDArray[Any],
    rows_per_env: int,
    conn: Connection,
    siblings: list[Connection],
    parent_pid: int,
) -> None:
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    for other in siblings:  # inherited ends of earlier workers' pipes: holding them would hide their EOF
        other.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    first_row = first_env * rows_per_env
    rows = slice(first_row, first_row + num_envs * rows_per_env)
    try:
        envs = serial_class(make_env, num_envs, name, {k: v[rows] for k, v in buffers.items()}, first_env)
        acts = actions[rows]
        conn.send_bytes(_OK)
        while True:
            cmd = conn.recv_bytes()
            if cmd == _STEP:
                envs.step(acts)
            elif cmd[:1] == _RESET:
                envs.reset(pickle.loads(cmd[1:]))
            else:
                break
            if envs.final_infos or envs.restarted:  # rare: episode-end infos, restarted envs
                infos = {first_row + i: info for i, info in envs.final_infos.items()}
                conn.send_bytes(_EVENTS + pickle.dumps((infos, envs.restarted)))
                envs.restarted = []
            else:
                conn.send_bytes(_OK)
        envs.close()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the main process is gone or closing: nothing to report to
    except BaseException as e:
        env_id = e.env_id if isinstance(e, EnvStepError) else -1
        with contextlib.suppress(BrokenPipeError, OSError):
            conn.send_bytes(_ERROR + pickle.dumps((env_id, str(e), traceback.format_exc())))


class MultiprocessBackend(VecBackend):
    autoreset = "same_step"
    unsaved_state = "envs run in worker processes"

    def __init__(
        self,
        make_env: Callable[[int], Any],
        num_envs: int,
        name: str,
        num_workers: int,
        async_factor: int = 1,
        serial_class: SerialClass = SerialBackend,
        recreate_failed_workers: bool = False,
    ):
        """``make_env(index)`` makes what ``serial_class`` steps: a gym.Env, or a multi-agent adapter.
        ``recreate_failed_workers``: a worker that dies is started anew over the same envs (see
        ``_recreate``) instead of stopping the run."""
        if num_envs % num_workers or num_workers % async_factor:
            raise EnvError(
                f"num_envs={num_envs} must be a multiple of num_workers={num_workers}, and num_workers "
                f"a multiple of async_factor={async_factor}."
            )
        # The row layout, before any process starts: a one-env backend in this process (its env is
        # not closed, since it may be the user's own instance).
        probe = serial_class(make_env, 1, name)
        obs, act, k = probe.obs_spec, probe.act_spec, probe.rows_per_env
        mask, state, info = probe.batch.action_mask, probe.batch.state, probe.batch.info
        self.agents, turn_based = probe.agents, probe.turn_based
        self.single_observation_space, self.single_action_space = (
            probe.single_observation_space,
            probe.single_action_space,
        )
        del probe
        self._maps: list[mmap.mmap] = []
        buffers = allocate_buffers(
            num_envs * k,
            obs,
            lambda shape, dtype: _shared_array(shape, dtype, self._maps),
            0 if mask is None else mask.shape[1],
            0 if state is None else state.shape[1],
            0 if info is None else info.shape[1],
            turn_based,
        )
        super().__init__(name, num_envs, obs, act, rows_per_env=k, buffers=buffers)
        self._actions = _shared_array((num_envs * k, *act.shape), act.dtype, self._maps)

        self.num_workers, self.async_factor = num_workers, async_factor
        per_worker = num_envs // num_workers
        self._worker_envs = [(w * per_worker, (w + 1) * per_worker - 1) for w in range(num_workers)]
        self._lay_out_groups(buffers, per_worker * k)
        self._worker_args = (serial_class, make_env, per_worker, name, buffers, k)
        self.recreate_failed_workers = recreate_failed_workers
        self._failed_rows: list[slice] = []  # rows of recreated workers, valid again at their next step
        self._seed: Seed = None  # the last reset's, from which a recreated worker's envs draw theirs
        self._recreated = 0  # workers started anew so far
        self._resetting = False  # a worker started anew during a reset is reset as the others
        self._reset_seeds: list[Any] = [None] * num_workers  # what each worker was sent in the last reset
        self._start_workers()

    def _lay_out_groups(self, buffers: Buffers, rows_per_worker: int) -> None:
        """The ``async_factor`` groups of consecutive workers, each stepping as one batch: a view of
        its rows of the shared ``buffers``."""
        workers_per_group = self.num_workers // self.async_factor
        self._group_workers = [
            list(range(g * workers_per_group, (g + 1) * workers_per_group)) for g in range(self.async_factor)
        ]
        self._group_of_worker = [w // workers_per_group for w in range(self.num_workers)]
        rows_per_group = rows_per_worker * workers_per_group
        groups = [slice(g * rows_per_group, (g + 1) * rows_per_group) for g in range(self.async_factor)]
        self.batches = [
            batch_view(buffers, rows, self.batch.env_id[rows], self.batch.agent_id[rows]) for rows in groups
        ]
        self._group_of = {id(b): g for g, b in enumerate(self.batches)}
        self._group_infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(self.async_factor)]
        self._pending = [0] * self.async_factor  # workers of each group still stepping
        self._ready: list[int] = []  # groups whose results are in, in arrival order
        self._last: StepBatch | None = None

    def _start_workers(self) -> None:
        """Start every worker process, and wait until each has built its envs."""
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for w in range(self.num_workers):
            proc, conn = self._spawn(w)
            self._conns.append(conn)
            self._procs.append(proc)
        self._closer = weakref.finalize(self, _shutdown, self._conns, self._procs)
        self._worker_of_fd = {conn.fileno(): w for w, conn in enumerate(self._conns)}
        self._poller = select.poll()
        for conn in self._conns:  # a worker that is not stepping sends nothing, so polling all is safe
            self._poller.register(conn.fileno(), select.POLLIN)
        self._group_conns = [[self._conns[w] for w in ws] for ws in self._group_workers]
        self._receive_all()  # every worker has built its envs

    def _spawn(self, w: int) -> tuple[BaseProcess, Connection]:
        """Start worker ``w`` over its envs' slice of the shared buffers."""
        serial_class, make_env, per_worker, name, buffers, k = self._worker_args
        parent_end, child_end = mp.get_context("fork").Pipe()
        siblings = [conn for other, conn in enumerate(self._conns) if other != w]
        args = (serial_class, make_env, w * per_worker, per_worker, name, buffers, self._actions, k, child_end)
        proc = mp.get_context("fork").Process(
            target=_worker, name=f"shoal-env-worker-{w}", daemon=True, args=(*args, siblings, os.getpid())
        )
        proc.start()
        child_end.close()
        return proc, parent_end

    def _recreate(self, w: int, why: str) -> None:
        """Worker ``w`` died: start it anew, reset its envs, and write the step it was taking as a
        truncation that is not a transition (``valid`` False, reward 0). The collector gives those
        rows the observation the step was taken from as their final one, since the dead worker may
        have overwritten part of the buffer."""
        old = self._conns[w]
        self._poller.unregister(old.fileno())
        del self._worker_of_fd[old.fileno()]
        old.close()
        self._procs[w], self._conns[w] = self._spawn(w)
        conn = self._conns[w]
        self._worker_of_fd[conn.fileno()] = w
        self._poller.register(conn.fileno(), select.POLLIN)
        g = self._group_of_worker[w]
        self._group_conns[g] = [self._conns[x] for x in self._group_workers[g]]
        self._receive(w, starting=True)  # its envs are built
        first, last = self._worker_envs[w]
        self._recreated += 1
        seed = self._seed + RESTART_SEED_STRIDE * self._recreated if isinstance(self._seed, int) else None
        conn.send_bytes(_RESET + pickle.dumps(self._reset_seeds[w] if self._resetting else seed))
        self._receive(w, starting=True)
        self.worker_restarts.append(why)
        if self._resetting:  # no step was under way: the reset's observations are all there is
            return
        k = self.rows_per_env
        rows = slice(first * k, (last + 1) * k)
        self._valid[rows], self._truncated[rows], self._terminated[rows], self._reward[rows] = False, True, False, 0.0
        self._failed_rows.append(rows)
        self.failed_rows.extend(range(rows.start, rows.stop))

    # ----- talking to workers -------------------------------------------------------------
    def _fail(self, message: str) -> NoReturn:
        self.close()
        raise EnvError(message)

    def _receive(self, w: int, starting: bool = False) -> None:
        try:
            reply = self._conns[w].recv_bytes()
        except (EOFError, ConnectionResetError):
            self._procs[w].join(timeout=1.0)
            first, last = self._worker_envs[w]
            died = (
                f"env worker {w} (envs {first}-{last} of '{self.name}') died with exit code {self._procs[w].exitcode}"
            )
            if starting or not self.recreate_failed_workers:
                self._fail(f"{died}{' while it was started anew' if starting else ''}.")
            self._recreate(w, died)
            return
        tag = reply[:1]
        if tag == _EVENTS:
            infos, restarted = pickle.loads(reply[1:])
            self._group_infos[self._group_of_worker[w]].update(infos)
            self.restarted.extend(restarted)
        elif tag == _ERROR:
            env_id, message, tb = pickle.loads(reply[1:])
            where = f"env {env_id}" if env_id >= 0 else f"worker {w}"
            self._fail(f"{message}\n--- traceback in env worker {w} ({where} of '{self.name}') ---\n{tb.rstrip()}")

    def _await_any(self) -> int:
        """Block until a stepping worker replies (a dead worker's pipe hangs up, which wakes this
        at once instead of hanging); handle the reply and return the worker. One poll object
        made up front: building a selector per call cost more than the wait itself."""
        fd, _ = self._poller.poll()[0]
        w = self._worker_of_fd[fd]
        self._receive(w)
        return w

    # ----- the flat-batch protocol --------------------------------------------------------
    def _receive_all(self) -> None:
        for w in range(self.num_workers):
            self._receive(w)

    def reset(self, seed: Seed = None) -> None:
        """Reset every env: an int (or None) goes to every worker, which adds its envs' ids; a list
        of one seed per env is cut into each worker's slice."""
        per_env = None if seed is None or isinstance(seed, int) else env_seeds(seed, self.num_envs, 0, self.name)
        self._seed = seed
        self._resetting = True
        for w, conn in enumerate(self._conns):
            first, last = self._worker_envs[w]
            self._reset_seeds[w] = seed if per_env is None else per_env[first : last + 1]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a dead worker: its reply says so
                conn.send_bytes(_RESET + pickle.dumps(self._reset_seeds[w]))
        for infos in self._group_infos:
            infos.clear()
        try:
            self._receive_all()
        finally:
            self._resetting = False
        self._pending = [0] * self.async_factor
        self._ready = list(range(self.async_factor))

    def recv(self) -> StepBatch:
        """The next group whose envs have all stepped (the whole batch when ``async_factor=1``).
        With nothing stepping, the last batch received is still the current one, as in the
        serial backend."""
        if not self._ready and not any(self._pending) and self._last is not None:
            return self._last
        if self.async_factor == 1 and self._pending[0]:
            self._receive_all()  # synchronous: read every worker in turn, no polling
            self._pending[0] = 0
            self._ready.append(0)
        while not self._ready:
            g = self._group_of_worker[self._await_any()]
            self._pending[g] -= 1
            if self._pending[g] == 0:
                self._ready.append(g)
        g = self._ready.pop(0)
        self._last = self.batches[g]
        self.final_infos = self._group_infos[g]
        return self._last

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        """Step the envs of ``batch`` (default: the one the last recv() returned) with ``actions``."""
        if batch is None:
            if self._last is None:
                raise RuntimeError("MultiprocessBackend.send() needs a batch from recv() first")
            batch = self._last
        g = self._group_of[id(batch)]
        if self._failed_rows:  # a recreated worker's rows take real steps again
            for rows in [r for r in self._failed_rows if batch.rows.start <= r.start < batch.rows.stop]:
                self._valid[rows] = True
                self._failed_rows.remove(rows)
        self._actions[batch.rows] = self.env_actions(actions)
        if self._group_infos[g]:
            self._group_infos[g].clear()
        for conn in self._group_conns[g]:
            try:  # noqa: SIM105  (suppress() would cost a call per step)
                conn.send_bytes(_STEP)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a dead worker: recv reports it
        self._pending[g] = len(self._group_conns[g])

    @property
    def pids(self) -> list[int]:
        return [cast(int, p.pid) for p in self._procs]  # started in __init__: each has a pid

    def close(self) -> None:
        self._closer()


def _shutdown(conns: list[Connection], procs: list[BaseProcess]) -> None:
    """Ask workers to exit, then make sure they have: no orphan survives a close."""
    for conn in conns:
        with contextlib.suppress(BrokenPipeError, OSError):
            conn.send_bytes(_CLOSE)
    for proc in procs:
        proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)
    for conn in conns:
        conn.close()
