"""``output=DIR``: every step the collector gathers, written to Minari datasets as it is collected.

    Algorithm.collect -> DatasetWriter(rollout, collector) -> (a copy of the rollout's fields)
      -> writer process: EpisodeAssembler (per agent row: steps -> whole episodes, per policy;
         shoal.offline.episodes), and for a recording EpisodeQuota
      -> ShardWriter per policy: DIR/<policy_id>/part-<k>-v0/, rotated every output_max_file_size bytes

The copy is all the training process does per collect. Cutting rows into episodes and writing
HDF5 (about a millisecond per episode, under the GIL) happen in a process of their own, so that
training does not wait for them; the queue between the two is bounded, so a writer that cannot keep
up slows training down instead of filling memory. A write the disk refuses ends the run with one
``OutputError`` at the next collect; the shards already closed are whole, and the one under way is
removed.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import queue
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import torch

from shoal.errors import OutputError
from shoal.files import free_space, refused_write
from shoal.offline.episodes import Block, EpisodeAssembler, EpisodeQuota, acting
from shoal.offline.minari_files import Array, EpisodeArrays, ShardWriter

if TYPE_CHECKING:
    from tensordict import TensorDict

    from shoal.algos.base import Collector
    from shoal.envs.spaces import EnvInfo

QUEUED_ROLLOUTS = 8
"""Rollouts waiting for the writer process at most; one more makes training wait for it."""

EXIT_WAIT_S = 120.0
"""How long Python's exit waits for the writer of a trainer never closed."""


def stored_spaces(env: EnvInfo) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The observation and action spaces of what the rollout stores: structured observations are
    flat float32 vectors there, and a Box observation is kept in its stored dtype."""
    obs, act = env.obs_spec, env.act_spec
    space = obs.space
    if obs.structured or (isinstance(space, gym.spaces.Box) and space.dtype != obs.dtype):
        flat = gym.spaces.flatten_space(space) if obs.structured else space
        assert isinstance(flat, gym.spaces.Box)
        space = gym.spaces.Box(flat.low.astype(obs.dtype), flat.high.astype(obs.dtype), obs.shape, obs.dtype)
    return space, act.space


@dataclass(frozen=True)
class WriterSettings:
    folder: Path
    policy_ids: tuple[str, ...]
    written: tuple[str, ...]
    """The policies whose episodes are written (the trained ones)."""
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    info_keys: tuple[str, ...]
    max_file_size: int
    metadata: dict[str, Any]
    max_episodes: int | None = None
    """Write this many episodes per policy, chosen in ``EpisodeQuota``'s order, then no more; the
    episodes under way at the end are dropped instead of cut (a recording of whole episodes)."""
    deterministic: bool = False
    """The policies took their most likely action: its probability was 1 (log-probability 0) for
    discrete actions, and is not a density for Box actions (NaN)."""


class DatasetWriter:
    """Hands each collected rollout to the writer process (``__call__``); ``close`` writes the
    episodes still under way as truncated at the last step collected and closes every shard."""

    def __init__(self, settings: WriterSettings, env_actions: Callable[[torch.Tensor], torch.Tensor]):
        """``env_actions``: the policies' actions as the env takes them (the backend's ``bounded_actions``)."""
        self.settings, self.env_actions = settings, env_actions
        settings.folder.mkdir(parents=True, exist_ok=True)
        context = mp.get_context("fork")  # the writer imports nothing the training process lacks
        self.queue = context.Queue(QUEUED_ROLLOUTS)
        self.results, child_end = context.Pipe(duplex=False)
        self.full = context.Event()
        """Set once every written policy has ``max_episodes`` episodes (a recording is complete)."""
        args = (settings, self.queue, child_end, self.full)
        self.process = context.Process(target=_write_loop, args=args, daemon=True)
        self.process.start()
        child_end.close()
        self.summary: dict[str, Any] | None = None
        # a trainer never closed (a script that ends after learn()) still finishes its datasets: this
        # runs before multiprocessing's own exit handler ends the (daemon) writer process
        atexit.register(self._close_at_exit)  # unregistered by close

    def __call__(self, rollout: TensorDict, collector: Collector) -> None:
        """Queue the rollout ``collector`` just filled: its steps as the env saw them, the env's own
        rewards (before scaling and clipping) and its Box actions as the env took them (clipped or
        rescaled), where the rollout keeps the learner's rewards and the policy's own samples."""
        self._raise_if_failed()
        fields: dict[str, Array] = {
            key: cast(torch.Tensor, rollout[key]).detach().cpu().numpy().copy() for key in _WRITTEN if key in rollout
        }
        fields["reward"] = collector.raw_reward.cpu().numpy().copy()
        fields["action"] = self.env_actions(cast(torch.Tensor, rollout["action"])).detach().cpu().numpy().copy()
        truncations = collector.truncations
        if truncations is None or not len(truncations):
            rows = steps = np.zeros(0, dtype=np.int64)
            final = fields["obs"][:0, 0]
            next_step = bool(truncations is not None and truncations.next_step)
        else:
            rows, steps = truncations.row.cpu().numpy(), truncations.step.cpu().numpy()
            final, next_step = truncations.obs.cpu().numpy(), truncations.next_step
        self._put(("block", Block(fields, rows, steps, final, next_step)))

    def _put(self, item: tuple[str, Any]) -> None:
        while True:  # a writer that died with a full queue must not leave training waiting for it
            try:
                self.queue.put(item, timeout=1.0)
                return
            except queue.Full:
                if not self.process.is_alive():
                    self._check(self._outcome())

    def _close_at_exit(self) -> None:
        try:
            self.close(timeout=EXIT_WAIT_S)
        except OutputError as e:  # no caller is left to raise to
            print(f"shoal: {e}", file=sys.stderr)

    def close(self, timeout: float | None = None) -> dict[str, Any]:
        """Finish every dataset; returns what was written (episodes, steps and shards per policy).
        A writer still busy after ``timeout`` seconds (None: no limit) is stopped, its shards under way lost."""
        if self.summary is not None:
            return self.summary
        atexit.unregister(self._close_at_exit)
        if self.process.is_alive():
            with contextlib.suppress(OutputError):  # a writer that failed says why below
                self._put(("close", None))
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            self.summary = {}
            raise OutputError(
                f"the dataset writer of '{self.settings.folder}' had not finished after {timeout:.0f} s and was "
                f"stopped; the shards closed before are whole, the ones under way were lost."
            )
        outcome = self._outcome()
        self.summary = {}
        self._check(outcome)
        summary: dict[str, Any] = outcome[1]
        self.summary = summary
        return summary

    def _raise_if_failed(self) -> None:
        if self.results.poll():
            self._check(self._outcome())

    def _outcome(self) -> tuple[str, Any]:
        """What the writer process reported; a process that died without a word (killed) is said so."""
        try:
            if self.results.poll():
                outcome: tuple[str, Any] = self.results.recv()
                return outcome
        except (EOFError, OSError):
            pass
        code = self.process.exitcode
        return "error", f"its process ended early (exit code {code}) without a report; was it killed?"

    def _check(self, outcome: tuple[str, Any]) -> None:
        kind, detail = outcome
        if kind == "error":
            self.summary = {}
            folder = self.settings.folder
            message, refused = detail if isinstance(detail, tuple) else (detail, False)
            if refused:
                raise OutputError(
                    f"could not write the dataset '{folder}': {message} ({free_space(folder)} free there now). "
                    f"The shards closed before it are whole; the one under way was removed."
                )
            raise OutputError(f"the dataset writer of '{folder}' failed: {message}")


_WRITTEN = (
    "obs",
    "action",
    "reward",
    "terminated",
    "truncated",
    "first",
    "valid",
    "policy_id",
    "action_mask",
    "sample_log_prob",
    "info",
)


def _write_loop(settings: WriterSettings, inbox: Any, results: Connection, full: Any) -> None:
    """The writer process: episodes from each block into each policy's current shard, a new shard
    once one passes ``max_file_size``; reports the summary (or the error) once at the end."""
    assembler = EpisodeAssembler(settings)
    quota = None if settings.max_episodes is None else EpisodeQuota(settings.max_episodes, settings.written)
    shards: dict[str, ShardWriter] = {}
    counts = {pid: {"episodes": 0, "steps": 0, "shards": 0} for pid in settings.written}

    def write(episodes: list[tuple[str, EpisodeArrays]]) -> None:
        for pid, episode in episodes:
            if pid not in counts:  # a policy that is not trained (a fixed opponent)
                continue
            shard = shards.get(pid)
            if shard is None:
                meta = settings.metadata | {"shoal_policy_id": pid}
                folder = settings.folder / pid
                shard = shards[pid] = ShardWriter(folder, settings.observation_space, settings.action_space, **meta)
            shard.add(episode)
            counts[pid]["episodes"] += 1
            counts[pid]["steps"] += len(episode)
            if shard.size >= settings.max_file_size:
                shard.close()
                counts[pid]["shards"] += 1
                del shards[pid]

    parent = os.getppid()
    try:
        while True:
            try:
                kind, block = inbox.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:  # the training process was killed: drop the shard under way
                    raise RuntimeError("the training process ended without closing the dataset") from None
                continue
            if kind == "close":
                break
            finished = assembler.add(block)
            if quota is None:
                write([(pid, episode) for pid, _, episode in finished])
                continue
            write(quota.offer(finished, acting(block)))
            if quota.full:
                full.set()
        if quota is None:
            write([(pid, episode) for pid, _, episode in assembler.flush()])
        for pid, shard in shards.items():
            shard.close()
            counts[pid]["shards"] += 1
        results.send(("done", counts))
    except BaseException as e:
        for shard in shards.values():
            shard.abandon()
        refusal = refused_write(e)
        if refusal is not None:
            results.send(("error", (f"{refusal.strerror} ({refusal.filename or settings.folder})", True)))
        else:
            results.send(("error", (f"{type(e).__name__}: {e}\n{traceback.format_exc()}", False)))
    finally:
        results.close()
