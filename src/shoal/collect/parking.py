"""When a group of envs parks in a rollout (``shoal.collect.collector``): once it has taken its
``T`` steps; with ``until_done``, as soon as every env in it has ended an episode since the
rollout started; with ``complete_episodes``, once every row has its cut, the first episode end
after its ``T`` new steps (``shoal.collect.carry``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from shoal.collect.episodes import env_episode_ends
from shoal.errors import EnvError
from shoal.vector.base import StepBatch, VecBackend


def check_parking(slots: int, until_done: bool, complete_episodes: int | None, stateful: bool) -> None:
    """A ``collect`` call's parking options fit each other, the policies (``stateful``: some keep
    a recurrent state) and the rollout's ``slots`` (``T + 1``)."""
    if until_done and complete_episodes is not None:
        raise ValueError("collect() takes until_done or complete_episodes, not both")
    if complete_episodes is not None and (stateful or complete_episodes >= slots):
        raise ValueError(
            f"complete_episodes={complete_episodes} needs feedforward policies and a rollout of T + 2H + 1 slots "
            f"(config.rollout_capacity + 1; this one has {slots})"
        )


class Parking:
    """One rollout's parking rule and what it follows per row; made once per ``collect``."""

    def __init__(
        self,
        backend: VecBackend,
        horizon: int,
        until_done: bool,
        complete_episodes: int | None,
        begin: npt.NDArray[np.int64],
    ):
        """``begin``: each row's first slot to write (after the steps it carried in, with
        ``complete_episodes``)."""
        self.backend, self.horizon, self.begin = backend, horizon, begin
        self.ended = torch.zeros(backend.num_rows, dtype=torch.bool) if until_done else None  # env ended an episode
        # complete_episodes: each row's last slot of this rollout (-1: not yet)
        self.cut = None if complete_episodes is None else np.full(backend.num_rows, -1, dtype=np.int64)
        self.fresh = complete_episodes or 0  # new steps each row takes before it may be cut
        self.longest = (horizon - self.fresh) // 2  # H: the capacity is T + 2H

    def stepped(self, batch: StepBatch, views: dict[str, Any], t: int) -> None:
        """Follow ``batch``'s step ``t``, its flags written (``views``): which envs ended an
        episode, and which rows past their ``T`` new steps are cut there."""
        if self.ended is not None:
            self._mark_ended(self.ended[batch.rows], views, t)
        if self.cut is not None and t + 1 - self.begin[batch.rows.start] >= self.fresh:
            self._mark_cut(self.cut[batch.rows], views, t)

    def parks(self, batch: StepBatch, t: int) -> bool:
        """Whether ``batch``'s group, at slot ``t``, is done with this rollout."""
        if self.cut is not None:
            parking = bool((self.cut[batch.rows] >= 0).all())
            # every row's episode ends within H steps (one more: a next-step reset) of its T-th new step
            if not parking and t - self.begin[batch.rows.start] > self.fresh + self.longest:
                raise self._too_long()
            return parking
        return t == self.horizon or (self.ended is not None and t > 0 and bool(self.ended[batch.rows].all()))

    def _mark_ended(self, ended: torch.Tensor, views: dict[str, Any], t: int) -> None:
        """Set ``ended`` (a batch's rows) where the row's env ended an episode at step ``t``: every
        agent still acting is done (one done row, for single-agent envs)."""
        k = self.backend.rows_per_env
        if k == 1:
            ended.logical_or_(views["done"][t])
            return
        envs = env_episode_ends(views["done"][t].numpy(), views["valid_np"], k, views["env_done_np"])
        ended.logical_or_(torch.from_numpy(envs).repeat_interleave(k))

    def _mark_cut(self, cut: npt.NDArray[np.int64], views: dict[str, Any], t: int) -> None:
        """Complete episodes: rows (of a batch, past their T new steps) whose env ended an episode
        at step ``t`` and have no cut yet are cut there."""
        done = views["terminated_np"] | views["truncated_np"]
        k = self.backend.rows_per_env
        if k > 1:
            done = np.repeat(env_episode_ends(done, views["valid_np"], k, views["env_done_np"]), k)
        cut[done & (cut < 0)] = t

    def _too_long(self) -> EnvError:
        fix = (
            "declare the most turns a game takes as max_episode_steps in env_config (max_cycles counts rounds "
            "of every agent's turn); a native env that takes turns must set env_done where its game ends"
            if self.backend.turn_based
            else "set horizon=H to end episodes after H steps"
        )
        return EnvError(
            f"env '{self.backend.name}' ran an episode longer than {self.longest} steps, the longest that "
            f"batch_mode='complete_episodes' was sized for (`horizon`, else the env's declared limit); {fix}; or "
            f"use batch_mode='truncate_episodes' for this env."
        )
