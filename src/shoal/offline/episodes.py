"""Cutting the writer's rollouts into whole episodes, agent row by agent row
(``EpisodeAssembler``), and picking a recording's episodes without favouring short ones
(``EpisodeQuota``). Both run in the dataset writer's process (``shoal.offline.writer``)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shoal.offline.minari_files import Array, EpisodeArrays

if TYPE_CHECKING:
    from shoal.offline.writer import WriterSettings

Finished = tuple[str, int, EpisodeArrays]
"""A whole episode with its policy id and the agent row that played it."""


@dataclass
class Block:
    """One rollout's fields as numpy copies, ``[N, T+1]`` each, and its truncations."""

    fields: dict[str, Array]
    truncated_rows: Array
    truncated_steps: Array
    final_obs: Array
    next_step: bool
    """Next-step autoreset: the slot after a step that ended an episode holds its final observation."""


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
