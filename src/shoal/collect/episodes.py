"""Per-row episode return and length, summarised RLlib-style (as its summarize_episodes).

Multi-agent envs (``agent_names`` given, one row per agent): every agent's own episode return
goes to ``agent_reward_mean/<agent>`` and ``episode_reward_mean`` is the team's: the sum of its
agents' returns over the env's episode. An env's episode ends at the step where every agent
still acting is done (agents that left earlier are padding by then). With several agents or
several policies, each agent's return also goes to ``policy_reward_mean/<policy>`` of the policy
that acted in that episode (RLlib's names).

A done step whose info holds ``EPISODE_CONTINUES: True`` ends the learning episode only (e.g. a life
lost in an Atari game, a terminal for the value function): the tracker keeps counting the
episode until a done step without it, so returns are whole games.

Custom metrics: every numeric scalar an env puts in the ``info`` of an episode's last step (and
anything an ``on_episode_end`` callback adds to ``episode.custom_metrics``) is aggregated over the
same smoothing window as the returns, as ``custom_metrics/<name>_mean/min/max``. The values of
``info_keys``, stored at every step, enter as their mean over the episode's steps instead.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch


@dataclass
class Episode:
    """A finished episode, as ``on_episode_end`` callbacks see it."""

    row: int
    """The agent's row in the flat batch."""
    env_id: int
    """The env the episode ran in."""
    episode_reward: float
    """The agent's undiscounted return, from the raw env rewards (before clipping or scaling)."""
    episode_length: int
    """Steps the agent took."""
    info: dict[str, Any]
    """The env's info dict of the last step."""
    custom_metrics: dict[str, float] = field(default_factory=dict)
    """The scalar numbers of ``info`` (e.g. ``is_success``) and what a callback adds; each is logged
    as ``custom_metrics/<name>_mean``, ``_min`` and ``_max``."""


EPISODE_CONTINUES = "episode_continues"  # info key: this done is a learning terminal, the episode goes on
StepInfos = dict[int, dict[int, dict[str, Any]]]  # step -> row -> info of an episode's last step


def numeric_items(info: dict[str, Any]) -> dict[str, float]:
    """The scalar numbers (bools included, e.g. ``is_success``) among an info dict's entries."""
    out = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, (Real, np.bool_)):
            out[key] = float(value)
    return out


def env_episode_ends(
    done: npt.NDArray[np.bool_],
    valid: npt.NDArray[np.bool_],
    rows_per_env: int,
    env_done: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.bool_]:
    """Which envs ended their episode, from row flags ``[..., rows]`` (env-major rows): an agent
    finished and none is left acting (the others are done too, or already padding). Returns
    ``[..., envs]`` bool. A turn-based env, whose waiting agents are not acting either, says it in
    ``env_done``; every row ending at once ends its game too, whatever the env says."""
    done = done.reshape(*done.shape[:-1], -1, rows_per_env)
    if env_done is not None:
        ends = env_done.reshape(done.shape).any(-1) | done.all(-1)
    else:
        ends = done.any(-1) & (done | ~valid.reshape(done.shape)).all(-1)
    return cast("npt.NDArray[np.bool_]", ends)  # an array: done has >= 2 dims here


def mark_episode_starts(
    done: torch.Tensor,
    valid: torch.Tensor,
    autoreset: str,
    rows_per_env: int,
    out: torch.Tensor,
    env_done: torch.Tensor | None = None,
) -> None:
    """Write into ``out`` which rows' current observation starts an episode, from the flags of the
    step that returned it (and ``env_done``, see ``env_episode_ends``). Same-step autoreset: every
    row of an env whose episode just ended (an agent that left early starts again only when its
    env resets); next-step: the reset step, which backends mark invalid."""
    if autoreset != "same_step":
        torch.logical_not(valid, out=out)
        return
    out.copy_(done)
    if rows_per_env > 1 and bool(out.any()):
        flags = None if env_done is None else env_done.numpy()
        ended = env_episode_ends(done.numpy(), valid.numpy(), rows_per_env, flags)
        out.copy_(torch.from_numpy(ended).repeat_interleave(rows_per_env))


def _mean(values: deque[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class EpisodeTracker:
    """Accumulates raw env rewards per agent row; finished episodes go to a smoothing window.

    Python touches only rows whose episode ended.
    """

    def __init__(
        self,
        num_rows: int,
        window: int,
        env_id: npt.NDArray[np.int64] | None = None,
        on_episode_end: Callable[[Episode], None] | None = None,
        agent_names: list[str] | None = None,
        policy_ids: list[str] | None = None,
        info_keys: list[str] | None = None,
        drop_failed: bool = False,
    ):
        """``drop_failed``: an episode ending at a step that was not a transition is one whose env
        failed and was made anew (``restart_failed_envs``, single-agent envs): it is left out."""
        self.agent_names = agent_names
        self.drop_failed = drop_failed
        self.info_keys = info_keys or []
        # running sums and counts of each row's info_keys values (nan: absent that step)
        self.info_sum = np.zeros((num_rows, len(self.info_keys)), dtype=np.float64)
        self.info_count = np.zeros((num_rows, len(self.info_keys)), dtype=np.int64)
        if agent_names:
            k = len(agent_names)
            self.team_ret = np.zeros(num_rows // k, dtype=np.float64)
            self.team_len = np.zeros(num_rows // k, dtype=np.int64)
            self.agent_returns: dict[str, deque[float]] = {a: deque(maxlen=window) for a in agent_names}
        self.policy_ids = policy_ids or ["default_policy"]
        self.policy_returns: dict[str, deque[float]] = {p: deque(maxlen=window) for p in self.policy_ids}
        self.per_policy = bool(agent_names) or len(self.policy_ids) > 1
        self.ret = np.zeros(num_rows, dtype=np.float64)
        self.len = np.zeros(num_rows, dtype=np.int64)
        self.window = window
        self.env_id = np.arange(num_rows) if env_id is None else env_id
        self.on_episode_end = on_episode_end
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.custom: dict[str, deque[float]] = {}
        self.episodes_total = 0
        self.episodes_this_iter = 0

    def add(
        self,
        reward: npt.NDArray[np.floating[Any]],
        done: npt.NDArray[np.bool_],
        valid: npt.NDArray[np.bool_],
        step_infos: StepInfos | None = None,
        policy: npt.NDArray[np.int64] | None = None,
        info: npt.NDArray[np.float32] | None = None,
        env_done: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Add ``T`` steps, arrays ``[T, rows]``; ``done`` rows (terminated or truncated) close their
        episode, also where the row did not act that step (a turn-based game ending on another
        agent's move); lengths count the steps a row acted, returns every reward it got.
        ``step_infos[t][row]`` is the info of an episode that ended at step t; ``policy[t, row]``
        the index of the policy that acted; ``info[t, row]`` the step's ``info_keys`` values;
        ``env_done[t, row]`` a turn-based env's game end (see ``env_episode_ends``).
        Episodes enter the window in the order they ended.

        A whole rollout at once: a few numpy ops over the block, and Python only for the episodes
        that ended in it (per step, the bookkeeping cost as much as a policy forward)."""
        # Running sums since the start of the block: an episode ending at step t has its
        # return so far plus cum_ret[t]; the next one starts from -cum_ret[t].
        step_infos = step_infos or {}
        done = self._episode_ends(done, step_infos)
        cum_ret = np.cumsum(reward, axis=0, dtype=np.float64)
        cum_len = np.cumsum(valid, axis=0, dtype=np.int64)
        steps, rows = np.nonzero(done)
        team_ends = self._team_ends(done, valid, env_done) if self.agent_names else {}
        if info is not None and self.info_keys:
            present = ~np.isnan(info) & valid[..., None]
            cum_info = np.cumsum(np.where(present, info, 0.0), axis=0, dtype=np.float64)
            cum_count = np.cumsum(present, axis=0, dtype=np.int64)
        dropped = 0
        for t, row in zip(steps.tolist(), rows.tolist()):
            ret, length = float(self.ret[row] + cum_ret[t, row]), int(self.len[row] + cum_len[t, row])
            means = {}
            if info is not None and self.info_keys:
                sums, counts = self.info_sum[row] + cum_info[t, row], self.info_count[row] + cum_count[t, row]
                means = {key: float(sums[k] / counts[k]) for k, key in enumerate(self.info_keys) if counts[k]}
                self.info_sum[row], self.info_count[row] = -cum_info[t, row], -cum_count[t, row]
            self.ret[row] = -cum_ret[t, row]
            self.len[row] = -cum_len[t, row]
            if self.drop_failed and not valid[t, row]:  # its env failed and was made anew: left out
                dropped += 1
                continue
            if self.per_policy:
                self.policy_returns[self.policy_ids[0 if policy is None else policy[t, row]]].append(ret)
            if self.agent_names:
                self._agent_episode(t, row, ret, length, team_ends)
            else:
                self.returns.append(ret)
                self.lengths.append(length)
            if step_infos or self.on_episode_end is not None or means:
                self._close(row, ret, length, step_infos.get(t, {}).get(row, {}), means)
        self.ret += cum_ret[-1]
        self.len += cum_len[-1]
        if info is not None and self.info_keys:
            self.info_sum += cum_info[-1]
            self.info_count += cum_count[-1]
        ended = len(team_ends) if self.agent_names else len(rows) - dropped  # multi-agent: the team's episodes
        self.episodes_this_iter += ended
        self.episodes_total += ended

    @staticmethod
    def _episode_ends(done: npt.NDArray[np.bool_], step_infos: StepInfos) -> npt.NDArray[np.bool_]:
        """``done`` without the steps whose info says the episode continues."""
        going_on = [
            (t, row) for t, infos in step_infos.items() for row, info in infos.items() if info.get(EPISODE_CONTINUES)
        ]
        if going_on:
            done = done.copy()
            done[tuple(zip(*going_on))] = False
        return done

    def reset_episodes(self, rows: slice = slice(None)) -> None:
        """Forget the episodes under way in ``rows`` (default: all; their envs were reset): running
        returns and lengths, per row and per team, start again from zero. ``rows`` covers whole envs."""
        self.ret[rows] = 0.0
        self.len[rows] = 0
        self.info_sum[rows] = 0.0
        self.info_count[rows] = 0
        if self.agent_names:
            k = len(self.agent_names)
            start, stop = (None if row is None else row // k for row in (rows.start, rows.stop))
            teams = slice(start, stop)
            self.team_ret[teams] = 0.0
            self.team_len[teams] = 0

    def _team_ends(
        self, done: npt.NDArray[np.bool_], valid: npt.NDArray[np.bool_], env_done: npt.NDArray[np.bool_] | None
    ) -> dict[tuple[int, int], int]:
        """Where an env's episode ended (``env_episode_ends``): ``(step, env) -> slot of the last
        agent finishing there``. Named agents only."""
        k = len(cast("list[str]", self.agent_names))
        steps, envs = np.nonzero(env_episode_ends(done, valid, k, env_done))
        finished = done.reshape(done.shape[0], -1, k)
        last = k - 1 - finished[steps, envs, ::-1].argmax(-1)
        return dict(zip(zip(steps.tolist(), envs.tolist()), last.tolist()))

    def _agent_episode(self, t: int, row: int, ret: float, length: int, team_ends: dict[tuple[int, int], int]) -> None:
        """One agent's episode ended at step t; the last of its team closes the team's episode."""
        names = cast("list[str]", self.agent_names)  # called for named agents only
        env, slot = divmod(row, len(names))
        self.agent_returns[names[slot]].append(ret)
        self.team_ret[env] += ret
        self.team_len[env] = max(self.team_len[env], length)
        if team_ends.get((t, env)) == slot:
            self.returns.append(float(self.team_ret[env]))
            self.lengths.append(int(self.team_len[env]))
            self.team_ret[env], self.team_len[env] = 0.0, 0

    def _close(self, row: int, ret: float, length: int, info: dict[str, Any], means: dict[str, float]) -> None:
        """``means``: the episode's mean of each ``info_keys`` value, which wins over the last step's."""
        episode = Episode(row, int(self.env_id[row]), ret, length, info, numeric_items(info) | means)
        if self.on_episode_end is not None:
            self.on_episode_end(episode)
        for name, value in episode.custom_metrics.items():
            self.custom.setdefault(name, deque(maxlen=self.window)).append(float(value))

    def summarize(self) -> dict[str, Any]:
        """Stats over the last ``window`` episodes; nan before the first one ends."""
        r = self.returns
        out: dict[str, Any] = {
            "episode_reward_mean": sum(r) / len(r) if r else math.nan,
            "episode_reward_min": min(r) if r else math.nan,
            "episode_reward_max": max(r) if r else math.nan,
            "episode_len_mean": sum(self.lengths) / len(self.lengths) if r else math.nan,
            "episodes_this_iter": self.episodes_this_iter,
            "episodes_total": self.episodes_total,
        }
        if self.per_policy:
            out["policy_reward_mean"] = {p: _mean(r) for p, r in self.policy_returns.items()}
        if self.agent_names:
            out["agent_reward_mean"] = {a: _mean(r) for a, r in self.agent_returns.items()}
        if self.custom:
            out["custom_metrics"] = {
                f"{name}_{stat}": fn(values)
                for name, values in sorted(self.custom.items())
                for stat, fn in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max))
            }
        self.episodes_this_iter = 0
        return out

    def forget(self) -> None:
        """Forget every episode, counted and under way (e.g. another process's, restored from its
        checkpoint)."""
        self.reset_episodes()
        self.episodes_total = 0
        self.returns.clear()
        self.lengths.clear()
        self.custom.clear()
        for window in self.policy_returns.values():
            window.clear()
        if self.agent_names:
            for window in self.agent_returns.values():
                window.clear()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "ret": self.ret.tolist(),
            "len": self.len.tolist(),
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "custom": {k: list(v) for k, v in self.custom.items()},
            "episodes_total": self.episodes_total,
            "policy_returns": {p: list(r) for p, r in self.policy_returns.items()},
            "info_sum": self.info_sum.tolist(),
            "info_count": self.info_count.tolist(),
        }
        if self.agent_names:
            state |= {
                "team_ret": self.team_ret.tolist(),
                "team_len": self.team_len.tolist(),
                "agent_returns": {a: list(r) for a, r in self.agent_returns.items()},
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ret[:] = state["ret"]
        self.len[:] = state["len"]
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.lengths.clear()
        self.lengths.extend(state["lengths"])
        self.custom = {k: deque(v, maxlen=self.window) for k, v in state["custom"].items()}
        self.episodes_total = state["episodes_total"]
        if "info_sum" in state and np.shape(state["info_sum"]) == self.info_sum.shape:
            self.info_sum[:], self.info_count[:] = state["info_sum"], state["info_count"]
        windows = [("policy_returns", self.policy_returns)]
        if self.agent_names:
            self.team_ret[:], self.team_len[:] = state["team_ret"], state["team_len"]
            windows.append(("agent_returns", self.agent_returns))
        for name, window in windows:
            for key, values in state[name].items():
                window[key].clear()
                window[key].extend(values)
