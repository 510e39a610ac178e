"""The collector: runs the policies on a backend and writes the rollout in place.

Batches arrive in whatever order the backend's env groups finish stepping (``async_factor``
groups; one when synchronous). Every agent row keeps its own write position, so each row's
trajectory is whole however the groups interleave. A group that has taken its ``T`` steps is
*parked*: its latest observation goes in slot ``T``, the policy's extras for it (the bootstrap
value, for PPO) are written there, and the group waits, not stepping, until the next rollout
starts from exactly that observation. ``until_done`` and ``complete_episodes`` park groups
earlier or later (``shoal.collect.parking``); the slots a group leaves unfilled are padding.

Per batch it does one forward per policy over the rows that policy owns (``PolicyMap``) and a
fixed handful of copies into views of the preallocated storage (made once per rollout storage
and batch). What the policies return besides actions (``extras``: the fields the algorithm
declared) is written straight into the rollout. Each row's ``first`` flag (its observation starts
an episode) and the policies' per-row state are carried from step to step, across rollouts,
through every backend.

The true final observation of each truncated episode is kept in ``truncations`` (only those
rows, so nothing is stored twice) for algorithms that bootstrap from it, with the policies'
state at that step. Given ``start_states`` (each policy's ``[N, K]`` state storage), the policies'
state of every row is stored there at the start of each of its ``K`` segments of ``T / K`` steps,
so a recurrent learner can replay each segment from where it began.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal.collect.carry import FLAGS, EpisodeCarry
from shoal.collect.critic import CriticInput
from shoal.collect.episodes import EpisodeTracker, StepInfos, env_episode_ends, mark_episode_starts
from shoal.collect.finite import check_env_outputs, non_finite_action
from shoal.collect.parking import Parking, check_parking
from shoal.collect.policies import PolicyMap
from shoal.collect.truncations import TruncatedRows, Truncations, gather_truncations, truncated_rows
from shoal.models.normalize import RewardScaler
from shoal.vector.base import Seed, StepBatch, VecBackend

FIELDS = ("obs", "action", "reward", "done", "terminated", "truncated", "first", "valid", "policy_id")  # each step


class Collector:
    def __init__(
        self,
        backend: VecBackend,
        policies: PolicyMap,
        tracker: EpisodeTracker | None,
        extras: tuple[str, ...],
        reward_scaler: RewardScaler | None = None,
        critic: CriticInput | None = None,
        clip_rewards: bool | float | None = None,
    ):
        """``tracker``: counts the episodes (None: whoever gathers this collector's rollouts counts them,
        from ``raw_reward`` and ``step_infos``). ``extras``: the fields the policies' ``act`` fills,
        stored at every step. ``clip_rewards``
        changes the learning signal only (True: the reward's sign; a number c: clipped to [-c, c]);
        the episode returns the tracker reports stay raw."""
        policies.check_extras(extras)
        self.backend, self.policies, self.tracker, self.critic = backend, policies, tracker, critic
        self.extras, self.reward_scaler, self.clip_rewards = extras, reward_scaler, clip_rewards
        self.env_steps = 0  # env steps collected so far
        # given the backend's lists of restarted envs and workers as they come (the trainer counts them
        # against its budget, which may stop the run before a crash loop fills the rollout)
        self.take_restarts: Callable[[list[tuple[int, str]], list[str]], None] | None = None
        self.sample_time_s = 0.0  # time spent collecting so far
        self.deterministic = False
        """Act with each policy's most likely action instead of sampling (recording a policy's own
        behaviour without its exploration, ``shoal dataset record``)."""
        self.truncations: Truncations | None = None
        """The last rollout's truncated steps and the true final observation of each (None before the
        first ``collect``), for algorithms that bootstrap from them."""
        self.first = torch.ones(backend.num_rows, dtype=torch.bool)  # the row's observation starts an episode
        # next-step autoreset: envs whose episode ended at their last step, mapped again after the next
        self._remap_next = np.zeros(backend.num_envs, dtype=bool)
        self._parked: list[StepBatch] = []  # groups whose current obs has not been acted on
        self._position = np.zeros(backend.num_rows, dtype=np.int64)  # next step each row writes
        self._views: dict[int, dict[str, Any]] = {}
        self._views_of: TensorDict | None = None
        self.raw_reward = torch.zeros(0, 0)
        """``[N, T+1]`` (sized on the first ``collect``): the env's rewards, before scaling and clipping."""
        self.step_infos: StepInfos = {}
        """The last rollout's infos of episodes' last steps: step -> row -> info."""
        self._truncated: list[TruncatedRows] = []
        self.carry: EpisodeCarry | None = None  # complete_episodes: the steps past each row's cut
        # complete_episodes: each row's slots at the front of the rollout under way that the last one held
        self._delivered = np.zeros(backend.num_rows, dtype=np.int64)

    def reset(self, seed: Seed) -> None:
        """Reset every env (``seed``: one int, one per env, or None); all groups start parked on
        their first observation, and the episodes under way are abandoned (the tracker forgets them)."""
        self.backend.reset(seed)
        if self.tracker is not None:
            self.tracker.reset_episodes()
        self.first.fill_(True)
        if self.carry is not None:
            self.carry.clear()
        self._remap_next[:] = False
        self.policies.start_episodes(range(self.backend.num_envs), self.backend.first_env_id)
        self._parked = [self.backend.recv() for _ in range(self.backend.async_factor)]

    def _views_for(
        self, rollout: TensorDict, batch: StepBatch, start_states: list[TensorDict] | None = None
    ) -> dict[str, Any]:
        """Per-step views ``field[t] -> [rows of batch, ...]`` of the storage, made once."""
        views = self._views.get(id(batch))
        if views is None:
            views = {key: rollout[key][batch.rows].unbind(1) for key in self._written(rollout)}
            views["raw_reward"] = self.raw_reward[batch.rows].unbind(1)
            views["extras"] = rollout.select(*self.extras)[batch.rows].unbind(1)
            views["first_now"] = self.first[batch.rows]
            views["start_states"] = [
                (p, states[batch.rows].unbind(1))
                for p, states in enumerate(start_states or [])
                if list(states.keys())  # a feedforward policy stores no state
            ]
            for key in ("terminated", "truncated", "valid"):  # numpy's any() costs a third of torch's
                views[f"{key}_np"] = getattr(batch, key).numpy()
            views["env_done_np"] = None if batch.env_done is None else batch.env_done.numpy()
            self._views[id(batch)] = views
        return views

    def _written(self, rollout: TensorDict) -> tuple[str, ...]:
        """The env fields the collector writes into ``rollout`` each step."""
        optional = ("action_mask", "critic_obs", "info", "env_done")
        return FIELDS + tuple(key for key in optional if key in rollout.keys())  # noqa: SIM118 (a TensorDict)

    def _bind(self, rollout: TensorDict) -> None:
        """Start writing into ``rollout``: its views are made afresh, once per batch."""
        if self._views_of is not rollout:
            self._views, self._views_of = {}, rollout
            # an algorithm that learns from the env's own rewards stores them in the rollout itself
            stored = "raw_reward" in rollout.keys()  # noqa: SIM118 (a TensorDict)
            self.raw_reward = rollout["raw_reward"] if stored else torch.zeros(rollout.batch_size)
            if self.critic is not None:
                self.critic.init(rollout["critic_obs"])

    @torch.inference_mode()
    def collect(
        self,
        rollout: TensorDict,
        start_states: list[TensorDict] | None = None,
        until_done: bool = False,
        complete_episodes: int | None = None,
    ) -> int:
        """Fill ``rollout`` ([N, T+1]) with T steps of every row, and ``start_states`` (each
        policy's ``[N, K]`` state storage, see the module docstring) when given; returns the number
        of env steps taken (agent steps divided by the agent rows per env).

        ``until_done``: a group is also parked as soon as every env in it has ended an episode since
        the rollout started (each row's first episode is then whole, as GRPO needs); its latest
        observation and the extras for it go in its next slot, and the slots it leaves unfilled are
        padding: ``valid`` False, no episode flags, zero reward. The count returned is the steps
        the groups took.

        ``complete_episodes=T``: every row takes at least T new steps and its data ends at its env's
        episode end; what its group stepped beyond that starts the next rollout
        (``shoal.collect.carry``; the rollout needs ``T + 2H`` slots for episodes of up to H
        steps). The count returned is the steps this rollout holds."""
        if not self._parked:
            raise RuntimeError("Collector.reset(seed) must be called before collect()")
        check_parking(rollout.batch_size[1], until_done, complete_episodes, self.policies.stateful)
        start = time.perf_counter()
        backend = self.backend
        horizon = rollout.batch_size[1] - 1
        segment = horizon // start_states[0].batch_size[1] if start_states else 0
        ready, self._parked = self._parked, []
        num_groups = len(ready)
        self._bind(rollout)
        self._truncated.clear()
        self._position[:] = 0
        step_infos: StepInfos = {}  # step -> row -> info of an episode's last step
        if complete_episodes is not None:
            step_infos = self._restore_carry(rollout)
        parking = Parking(backend, horizon, until_done, complete_episodes, self._position.copy())
        while len(self._parked) < num_groups:
            resumed = bool(ready)  # parked since the last rollout: its obs is current, no step result to record
            batch = ready.pop() if resumed else backend.recv()
            if (backend.restarted or backend.worker_restarts) and self.take_restarts is not None:
                self.take_restarts(backend.restarted, backend.worker_restarts)
            views = self._views_for(rollout, batch, start_states)
            t = int(self._position[batch.rows.start])
            if not resumed:
                self._record_step(batch, views, t - 1, step_infos)
                parking.stepped(batch, views, t - 1)
            self._write_obs(batch, views, t, segment, horizon)
            if parking.parks(batch, t):
                self._park(rollout, batch, views, t, horizon)
                continue
            self._send(self._act(batch, views, t, parked=False), batch, views, t)
        steps = self._finish(rollout, horizon, parking, step_infos)
        self.env_steps += steps
        self.sample_time_s += time.perf_counter() - start
        return steps

    def _write_obs(self, batch: StepBatch, views: dict[str, Any], t: int, segment: int, horizon: int) -> None:
        """Slot ``t`` of ``batch``'s rows: the observation the policies act on, with its action
        mask, critic input, owners and episode starts; at a segment start, the policies' state."""
        obs = views["obs"][t].copy_(batch.obs)
        if batch.action_mask is not None:
            views["action_mask"][t].copy_(batch.action_mask)
        if self.critic is not None:
            self.critic.write(batch, obs, views["critic_obs"][t])
        policies = self.policies
        if not policies.single:
            views["policy_id"][t].copy_(policies.row_policy[batch.rows])
        views["first"][t].copy_(views["first_now"])
        if segment and t % segment == 0 and t < horizon:
            for p, stored in views["start_states"]:
                stored[t // segment].update_(policies.state(p, batch.rows))

    def _act(self, batch: StepBatch, views: dict[str, Any], t: int, parked: bool) -> torch.Tensor:
        """The policies' actions for slot ``t``, their extras written there. For a parked group the
        extras alone count (the bootstrap): its action is not taken, so it is not sampled (no random
        draw is spent) and the policies' state stays as it was."""
        action, _ = self.policies.act(
            views["obs"][t],
            views["first_now"],
            None if batch.action_mask is None else views["action_mask"][t],
            batch.rows,
            deterministic=parked or self.deterministic,
            out=views["extras"][t],
            critic_obs=None if self.critic is None else views["critic_obs"][t],
            advance=not parked,
        )
        return action

    def _park(self, rollout: TensorDict, batch: StepBatch, views: dict[str, Any], t: int, horizon: int) -> None:
        """``batch``'s group is done with this rollout: the extras for its current observation go
        in slot ``t``, the slots after it are padding, and it waits there, not stepping, until the
        next rollout starts from that observation."""
        if self.extras:  # a learner storing no extras (replay) needs no forward pass
            self._act(batch, views, t, parked=True)
        self._parked.append(batch)
        if t < horizon:
            self._pad(rollout, batch.rows, t, horizon)

    def _send(self, action: torch.Tensor, batch: StepBatch, views: dict[str, Any], t: int) -> None:
        """Store ``batch``'s actions in slot ``t`` and send them to its envs."""
        backend = self.backend
        if backend.logs_actions:  # external clients may have taken actions of their own
            action = backend.logged(action, batch)
        if action.is_floating_point() and not bool(torch.isfinite(action).all()):  # one read per step
            raise non_finite_action(action, batch, views["obs"][t], self.policies, backend)
        views["action"][t].copy_(action)
        backend.send(action, batch)
        self._position[batch.rows] = t + 1

    def _finish(self, rollout: TensorDict, horizon: int, parking: Parking, step_infos: StepInfos) -> int:
        """Close the rollout: its truncations, its episodes counted, the env's outputs checked;
        returns the env steps it holds."""
        k = self.backend.rows_per_env
        if parking.cut is None:
            self.truncations = gather_truncations(rollout, horizon, self.backend.autoreset, self._truncated)
            whole = parking.ended is None  # every row took its T steps
            steps = self.backend.num_envs * horizon if whole else int(self._position.sum()) // k
        else:
            step_infos = self._carry_over(rollout, horizon, parking.cut, step_infos)
            steps = int((parking.cut + 1 - self._delivered).sum()) // k
        self._track(rollout, horizon, step_infos)
        check_env_outputs(rollout, horizon, self.backend)
        return steps

    def _restore_carry(self, rollout: TensorDict) -> StepInfos:
        """Complete episodes: the steps carried from the last rollout go to the front of this one
        (and each row starts writing after them); returns their episode infos."""
        if self.carry is None:
            self.carry = EpisodeCarry(self.backend.num_rows, (*self._written(rollout), *self.extras))
        carry = self.carry
        np.copyto(self._delivered, carry.delivered)
        carry.restore(rollout, self.raw_reward)
        self._position[:] = carry.length
        step_infos, carry.step_infos = carry.step_infos, {}
        if carry.truncated is not None:
            self._truncated.append((*carry.truncated, []))
        return step_infos

    def _carry_over(
        self, rollout: TensorDict, horizon: int, cut: npt.NDArray[np.int64], step_infos: StepInfos
    ) -> StepInfos:
        """Complete episodes: each group's steps past its rows' cuts go to the next rollout (the
        truncations and episode infos among them too); returns this rollout's infos."""
        assert self.carry is not None  # collect() made it
        start = np.zeros_like(cut)
        for batch in self._parked:
            rows = batch.rows
            start[rows] = self.carry.keep(rollout, self.raw_reward, rows, cut[rows], int(self._position[rows.start]))
        # after keep(): next-step truncations are read from the flags
        truncations = gather_truncations(rollout, horizon, self.backend.autoreset, self._truncated)
        if not truncations.next_step:
            parts = (truncations.row, truncations.step, truncations.obs, truncations.critic_obs)
            truncations = Truncations(*self.carry.split_truncated(parts, cut, start), [])
        self.truncations = truncations
        return self.carry.split_infos(step_infos, cut, start)

    def _track(self, rollout: TensorDict, horizon: int, step_infos: StepInfos) -> None:
        """Count the rollout's episodes (from the raw rewards) in the tracker, if this collector has one."""
        self.step_infos = step_infos
        if self.tracker is not None:
            self.tracker.add(
                self.raw_reward[:, :horizon].numpy().T,
                rollout["done"].numpy()[:, :horizon].T,
                rollout["valid"].numpy()[:, :horizon].T,
                step_infos,
                rollout["policy_id"].numpy()[:, :horizon].T,
                rollout["info"].numpy()[:, :horizon].transpose(1, 0, 2) if "info" in rollout.keys() else None,  # noqa: SIM118
                rollout["env_done"].numpy()[:, :horizon].T if "env_done" in rollout.keys() else None,  # noqa: SIM118
            )

    def _record_step(self, batch: StepBatch, views: dict[str, Any], t: int, step_infos: StepInfos) -> None:
        """Write the result of step ``t`` (reward, flags, truncated episodes' last observations) for
        ``batch``'s rows, and which rows start an episode now."""
        if self.backend.failed_rows:  # its worker died taking this step (recreate_failed_workers)
            self._failed_step(batch, views, t)
        done = torch.logical_or(batch.terminated, batch.truncated, out=views["done"][t])
        reward = views["reward"][t]
        if self.reward_scaler is None:
            reward.copy_(batch.reward)
        else:
            self.reward_scaler.scale(batch.reward, done, out=reward, rows=batch.rows)
        if self.clip_rewards is True:
            reward.sign_()
        elif self.clip_rewards:
            reward.clamp_(-self.clip_rewards, self.clip_rewards)
        views["raw_reward"][t].copy_(batch.reward)
        if self.policies.reward_fed:  # before the truncated rows' states are kept: they saw this reward
            self.policies.feed_rewards(batch.reward, batch.rows)
        views["terminated"][t].copy_(batch.terminated)
        views["truncated"][t].copy_(batch.truncated)
        views["valid"][t].copy_(batch.valid)
        if batch.info is not None:
            views["info"][t].copy_(batch.info)
        if batch.env_done is not None:
            views["env_done"][t].copy_(batch.env_done)
        k = self.backend.rows_per_env
        mark_episode_starts(done, batch.valid, self.backend.autoreset, k, views["first_now"], batch.env_done)
        if self.backend.final_infos:  # only at episode ends, and only when an env sets infos
            step_infos.setdefault(t, {}).update(self.backend.final_infos)
        if self.backend.autoreset == "same_step" and views["truncated_np"].any():
            self._truncated.append(truncated_rows(batch, t, self.critic, self.policies))
        if not self.policies.single:
            self._start_episodes(batch, views)

    def _pad(self, rollout: TensorDict, rows: slice, t: int, horizon: int) -> None:
        """Slots ``t..T-1`` of ``rows`` were not stepped: padding, masked from every loss and from the
        episode statistics (no flags, zero reward)."""
        for key in FLAGS:
            if key in rollout.keys():  # noqa: SIM118 (a TensorDict)
                rollout[key][rows, t:horizon] = False
        rollout["reward"][rows, t:horizon] = 0.0
        self.raw_reward[rows, t:horizon] = 0.0

    def _start_episodes(self, batch: StepBatch, views: dict[str, Any]) -> None:
        """Envs whose next observation starts an episode map their agents to policies again. With
        same-step autoreset: those whose episode ended this step (an agent finished and none is
        left acting). With next-step autoreset: those whose episode ended at the step before, this
        step being the reset: the ended episode's policy has valued its last observation (a
        truncation's bootstrap). Not on every step a row is not valid: an external env's idle
        slot is padding, not a new episode, at each step it idles."""
        k = self.backend.rows_per_env
        done = views["terminated_np"] | views["truncated_np"]
        ended = env_episode_ends(done, views["valid_np"], k, views["env_done_np"]) if done.any() else None
        envs = slice(batch.rows.start // k, batch.rows.stop // k)
        if self.backend.autoreset == "next_step":
            starting = np.flatnonzero(self._remap_next[envs])
            self._remap_next[envs] = False if ended is None else ended
        elif ended is None:
            return
        else:
            starting = np.flatnonzero(ended)
        if len(starting):
            self.policies.start_episodes(starting + envs.start, self.backend.first_env_id)

    def _failed_step(self, batch: StepBatch, views: dict[str, Any], t: int) -> None:
        """The batch's rows whose worker died during step ``t`` end their episode there as a
        truncation from the observation the step was taken from (the backend wrote the flags)."""
        mine = [r for r in self.backend.failed_rows if batch.rows.start <= r < batch.rows.stop]
        if not mine:
            return
        local = torch.tensor(mine) - batch.rows.start
        batch.final_obs[local] = views["obs"][t][local]
        self.backend.failed_rows[:] = [r for r in self.backend.failed_rows if r not in mine]

    def iteration_stats(self) -> dict[str, float]:
        """What the trainer adds to each iteration's result, called once per iteration (nothing for
        local envs)."""
        return {}

    # ----- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "first": self.first.clone(),
            "policy_map": self.policies.state_dict(),
            "tracker": None if self.tracker is None else self.tracker.state_dict(),
            "env_steps": self.env_steps,
            "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state_dict(),
            "carry": None if self.carry is None else self.carry.state_dict(),
            "remap_next": torch.from_numpy(self._remap_next.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first.copy_(state["first"])
        self.policies.load_state_dict(state["policy_map"])
        if self.tracker is not None:
            self.tracker.load_state_dict(state["tracker"])
        self.env_steps = state["env_steps"]
        if self.reward_scaler is not None and state["reward_scaler"] is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])
        if state.get("carry") is not None:
            self.carry = EpisodeCarry.from_state(self.backend.num_rows, state["carry"])
        if state.get("remap_next") is not None:  # written since next-step envs map their policies at the reset step
            self._remap_next[:] = state["remap_next"].numpy()
