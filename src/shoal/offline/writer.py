"""``output=DIR``: every step the collector gathers, written to Minari datasets as it is collected.

    Algorithm.collect -> DatasetWriter(rollout, truncations) -> (a copy of the rollout's fields)
      -> writer process: EpisodeAssembler (per agent row: steps -> whole episodes, per policy)
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
import bisect
import contextlib
import multiprocessing as mp
import os
import queue
import sys
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import torch

from shoal.errors import OutputError
from shoal.files import free_space, refused_write
from shoal.offline.minari_files import Array, EpisodeArrays, ShardWriter

if TYPE_CHECKING:
    from tensordict import TensorDict

    from shoal.algos.base import Collector
    from shoal.envs.spaces import EnvInfo

QUEUED_ROLLOUTS = 8
"""Rollouts waiting for the writer process at most; one more makes training wait for it."""

EXIT_WAIT_S = 120.0
"""How long Python's exit waits for the writer of a trainer never closed."""

Finished = tuple[str, int, EpisodeArrays]
"""A whole episode with its policy id and the agent row that played it."""


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


@dataclass
class Block:
    """One rollout's fields as numpy copies, ``[N, T+1]`` each, and its truncations."""

    fields: dict[str, Array]
    truncated_rows: Array
    truncated_steps: Array
    final_obs: Array
    next_step: bool
    """Next-step autoreset: the slot after a step that ended an episode holds its final observation."""


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


@dataclass
class Piece:
    """Steps of one agent row in one block, copied out of it, so that an episode spanning many
    rollouts holds only its own steps and not every block it touched."""

    fields: dict[str, Array]
    after: Array
    """The observation collected after the last step (a cut episode's final one)."""

    @classmethod
    def of(cls, block: Block, row: int, steps: Array) -> Piece:
        after = block.fields["obs"][row, steps[-1] + 1].copy()  # a view would keep the whole block alive
        return cls({key: value[row, steps] for key, value in block.fields.items()}, after)


class EpisodeAssembler:
    """Cuts each agent row's steps, rollout after rollout, into whole episodes: a row's open episode
    is kept as pieces until the step that ends it arrives."""

    def __init__(self, settings: WriterSettings):
        self.settings = settings
        self.open: dict[int, list[Piece]] = {}  # row -> the pieces of its open episode

    def add(self, block: Block) -> list[Finished]:
        """The episodes ``block`` ends, each with its policy id and agent row, in each row's order."""
        f = block.fields
        valid, first = f["valid"][:, :-1], f["first"][:, :-1]
        done = (f["terminated"][:, :-1] | f["truncated"][:, :-1]) & valid
        finished: list[Finished] = []
        for row in range(valid.shape[0]):
            if not valid[row].all():
                self._add_row_with_turns(block, row, finished)
                continue
            pieces = self.open.setdefault(row, [])
            start = 0
            for end in [*np.flatnonzero(done[row]).tolist(), None]:
                stop = valid.shape[1] if end is None else end + 1
                steps = np.flatnonzero(valid[row, start:stop]) + start
                if len(steps) and first[row, steps[0]] and pieces:
                    pieces.clear()  # the open episode was abandoned (the envs were reset): its end is unknown
                if len(steps):
                    pieces.append(Piece.of(block, row, steps))
                if end is not None and pieces:
                    finished.append(self._episode(pieces, row, self._final_obs(block, row, end)))
                    pieces.clear()
                start = stop
        return finished

    def _add_row_with_turns(self, block: Block, row: int, finished: list[Finished]) -> None:
        """A row with steps that are not its decisions (the other players' turns, a dead agent's
        padding, a next-step reset), step by step, as the learners read them: such a step's reward
        goes to the row's last decision, and its done flag ends that decision's episode (the loser
        of a turn-based game learns it lost on the winner's move)."""
        f = block.fields
        pieces = self.open.setdefault(row, [])
        taken: list[int] = []  # this block's decisions in the open episode

        def last_decision() -> tuple[dict[str, Array], Any] | None:
            """The fields holding the row's last decision, and its index there."""
            if taken:
                return f, (row, taken[-1])
            return (pieces[-1].fields, -1) if pieces else None

        def end_episode(t: int) -> None:
            if taken:
                pieces.append(Piece.of(block, row, np.array(taken)))
                taken.clear()
            finished.append(self._episode(pieces, row, self._final_obs(block, row, t)))
            pieces.clear()

        for t in range(f["valid"].shape[1] - 1):
            ends = bool(f["terminated"][row, t] or f["truncated"][row, t])
            if f["valid"][row, t]:
                if f["first"][row, t] and (pieces or taken):  # the open episode was abandoned (a reset)
                    pieces.clear()
                    taken.clear()
                taken.append(t)
                if ends:
                    end_episode(t)
                continue
            owner = last_decision()
            if owner is None:  # no episode open: a reset step, or the turns before this row's first
                continue
            fields, at = owner
            fields["reward"][at] += f["reward"][row, t]
            if ends:
                terminated = bool(f["terminated"][row, t])
                fields["terminated"][at] = terminated
                fields["truncated"][at] = not terminated
                end_episode(t)
        if taken:
            pieces.append(Piece.of(block, row, np.array(taken)))

    def flush(self) -> list[Finished]:
        """The episodes still under way, each cut at its last step as a truncation (its final
        observation is the one collected after that step)."""
        out = []
        for row, pieces in self.open.items():
            if pieces:
                pid, row, episode = self._episode(pieces, row, pieces[-1].after)
                episode.truncations[-1] = not episode.terminations[-1]
                out.append((pid, row, episode))
        self.open.clear()
        return out

    @staticmethod
    def _final_obs(block: Block, row: int, step: int) -> Array:
        """The true last observation of the episode ``row`` ended at ``step``: the truncation's, the
        next slot's with next-step autoreset, and zeros for a terminal step otherwise (no learner
        reads it, so the envs do not keep it)."""
        obs = block.fields["obs"]
        if block.next_step:
            return np.asarray(obs[row, step + 1])
        hit = np.flatnonzero((block.truncated_rows == row) & (block.truncated_steps == step))
        return np.asarray(block.final_obs[hit[0]]) if len(hit) else np.zeros_like(obs[row, step])

    def _episode(self, pieces: Sequence[Piece], row: int, final_obs: Array) -> Finished:
        def cat(key: str) -> Array:
            return np.concatenate([piece.fields[key] for piece in pieces])

        first = pieces[0].fields
        policy = self.settings.policy_ids[int(first["policy_id"][0])]
        obs = cat("obs")
        episode = EpisodeArrays(
            observations=np.concatenate([obs, final_obs[None]]),
            actions=cat("action"),
            rewards=cat("reward"),
            terminations=cat("terminated"),
            truncations=cat("truncated"),
        )
        n = len(obs)
        if "action_mask" in first:
            mask = cat("action_mask")
            episode.infos["action_mask"] = np.concatenate([mask, np.ones_like(mask[:1])])
        if self.settings.deterministic:
            box = isinstance(self.settings.action_space, gym.spaces.Box)
            episode.infos["action_log_prob"] = np.full(n + 1, np.nan if box else 0.0, np.float32)
            episode.infos["action_log_prob"][-1] = np.nan
        elif "sample_log_prob" in first:
            episode.infos["action_log_prob"] = np.append(cat("sample_log_prob"), np.nan).astype(np.float32)
        if "info" in first:  # row t + 1 holds the info of step t
            values = cat("info")
            for k, key in enumerate(self.settings.info_keys):
                episode.infos[key] = np.concatenate([[np.nan], values[:, k]]).astype(np.float32)
        assert len(episode.observations) == n + 1
        return policy, row, episode


class EpisodeQuota:
    """Picks ``per_policy`` episodes of each written policy without favouring short ones.

    Taking the first episodes to finish would: short episodes finish first. Instead each agent row's
    episodes are taken in turn, in rounds (every row's first episode, in row order, then every row's
    second, ...), waiting for a row whose episode is still under way, so which episodes are taken
    does not depend on their lengths. A row with no step in a whole block (an absent agent) is not
    waited for until it acts again.
    """

    def __init__(self, per_policy: int, written: Sequence[str]):
        self.per_policy = per_policy
        self.counts = dict.fromkeys(written, 0)
        self.waiting: dict[int, deque[tuple[str, EpisodeArrays]]] = {}  # row -> its finished episodes, in order
        self.offered: dict[int, int] = {}  # row -> its episodes so far
        # a round takes at most one episode of a row, so a row's later episodes are never taken
        self.most_per_row = per_policy * max(len(written), 1)
        self.turn = 0  # the row whose episode is taken next (or the first after it, of those waited for)

    @property
    def full(self) -> bool:
        return min(self.counts.values(), default=self.per_policy) >= self.per_policy

    def offer(self, finished: list[Finished], acting_rows: Array) -> list[tuple[str, EpisodeArrays]]:
        """The episodes to write now, of those just ``finished``; ``acting_rows`` are the rows with a
        step in the block (``acting``)."""
        acting = set(acting_rows.tolist())
        for row in acting:
            self.waiting.setdefault(row, deque())
        for pid, row, episode in finished:
            self.offered[row] = self.offered.get(row, 0) + 1
            if self.offered[row] <= self.most_per_row:
                self.waiting.setdefault(row, deque()).append((pid, episode))
        taken: list[tuple[str, EpisodeArrays]] = []
        rows = sorted(self.waiting)
        if not rows:
            return taken
        i, passed = bisect.bisect_left(rows, self.turn) % len(rows), 0
        while not self.full and passed < len(rows):
            queue = self.waiting[rows[i]]
            if queue:
                pid, episode = queue.popleft()
                if self.counts.get(pid, self.per_policy) < self.per_policy:  # not a policy written, or one done
                    self.counts[pid] += 1
                    taken.append((pid, episode))
                passed = 0
            elif rows[i] in acting:
                break  # its episode is under way: wait for it
            else:
                passed += 1  # absent from this block: passed over
            i = (i + 1) % len(rows)
        self.turn = rows[i]
        return taken


def acting(block: Block) -> Array:
    """The rows with a step in ``block`` (its last slot only starts the next rollout)."""
    return np.flatnonzero(block.fields["valid"][:, :-1].any(axis=1))


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
