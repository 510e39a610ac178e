"""The collector: runs the policies on a backend and writes the rollout in place.

Batches arrive in whatever order the backend's env groups finish stepping (``async_factor``
groups; one when synchronous). Every agent row keeps its own write position, so each row's
trajectory is whole however the groups interleave. A group that has taken its ``T`` steps is
*parked*: its latest observation goes in slot ``T``, the policy's extras for it (the bootstrap
value, for PPO) are written there, and the group waits, not stepping, until the next rollout
starts from exactly that observation. With ``collect(..., until_done=True)`` a group is parked as
soon as every env in it has ended an episode (GRPO's rollouts: each row's first episode whole);
its latest observation goes in its next slot and the rest of its fragment is padding. With
``collect(..., complete_episodes=T)`` every row's data ends at an episode end
(``shoal.collect.carry``).

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
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal.collect.carry import EpisodeCarry
from shoal.collect.critic import CriticInput
from shoal.collect.episodes import EpisodeTracker, StepInfos, env_episode_ends, mark_episode_starts
from shoal.collect.policies import PolicyMap
from shoal.errors import ConfigError, EnvError, ShoalError, TrainingDiverged
from shoal.models.normalize import RewardScaler
from shoal.vector.base import Seed, StepBatch, VecBackend

FIELDS = (
    "obs",
    "action",
    "reward",
    "done",
    "terminated",
    "truncated",
    "first",
    "valid",
    "policy_id",
)  # written each step


@dataclass
class Truncations:
    """The truncated transitions of a rollout: ``row``, ``step`` and the true last observation
    ``obs`` (and centralized-critic input) of each, ``[K, ...]``; ``states``: each policy's state
    of those rows after acting at that step, the state a recurrent policy sees the last
    observation with (an empty list when no policy keeps state). With next-step autoreset the last
    observation is the rollout's next step (``next_step`` True), where the policies acted on it."""

    row: torch.Tensor
    step: torch.Tensor
    obs: torch.Tensor
    critic_obs: torch.Tensor | None
    states: list[TensorDict]
    next_step: bool = False

    def __len__(self) -> int:
        return len(self.row)


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
        for pid, module in zip(policies.ids, policies.modules):
            missing = [key for key in extras if key not in module.extras]
            if missing:
                raise ConfigError(
                    f"policy '{pid}' ({type(module).__name__}) does not give the per-step fields {missing} "
                    f"the algorithm stores; its act() fills {list(module.extras)}."
                )
        self.backend, self.policies, self.tracker, self.critic = backend, policies, tracker, critic
        self.extras, self.reward_scaler, self.clip_rewards = extras, reward_scaler, clip_rewards
        self.env_steps = 0  # env steps collected so far
        # given the backend's lists of restarted envs and workers as they come (the trainer counts them
        # against its budget, which may stop the run before a crash loop fills the rollout)
        self.take_restarts: Callable[[list[tuple[int, str]], list[str]], None] | None = None
        self.sample_time_s = 0.0  # time spent collecting so far
        self.truncations: Truncations | None = None
        """The last rollout's truncated steps and the true final observation of each (None before the
        first ``collect``), for algorithms that bootstrap from them."""
        self.first = torch.ones(backend.num_rows, dtype=torch.bool)  # the row's observation starts an episode
        self._parked: list[StepBatch] = []  # groups whose current obs has not been acted on
        self._position = np.zeros(backend.num_rows, dtype=np.int64)  # next step each row writes
        self._views: dict[int, dict[str, Any]] = {}
        self._views_of: TensorDict | None = None
        self.raw_reward = torch.zeros(0, 0)
        """``[N, T+1]`` (sized on the first ``collect``): the env's rewards, before scaling and clipping."""
        self.step_infos: StepInfos = {}
        """The last rollout's infos of episodes' last steps: step -> row -> info."""
        self._truncated: list[
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, list[TensorDict]]
        ] = []
        self.carry: EpisodeCarry | None = None  # complete_episodes: the steps past each row's cut

    def reset(self, seed: Seed) -> None:
        """Reset every env (``seed``: one int, one per env, or None); all groups start parked on
        their first observation, and the episodes under way are abandoned (the tracker forgets them)."""
        self.backend.reset(seed)
        if self.tracker is not None:
            self.tracker.reset_episodes()
        self.first.fill_(True)
        if self.carry is not None:
            self.carry.clear()
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
            self._views[id(batch)] = views
        return views

    def _written(self, rollout: TensorDict) -> tuple[str, ...]:
        """The env fields the collector writes into ``rollout`` each step."""
        return FIELDS + tuple(key for key in ("action_mask", "critic_obs", "info") if key in rollout.keys())  # noqa: SIM118 (a TensorDict)

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
        if until_done and complete_episodes is not None:
            raise ValueError("collect() takes until_done or complete_episodes, not both")
        if complete_episodes is not None and (self.policies.stateful or complete_episodes >= rollout.batch_size[1]):
            raise ValueError(
                f"complete_episodes={complete_episodes} needs feedforward policies and a rollout of T + 2H + 1 slots "
                f"(config.rollout_capacity + 1; this one has {rollout.batch_size[1]})"
            )
        start = time.perf_counter()
        backend, policies = self.backend, self.policies
        horizon = rollout.batch_size[1] - 1
        segment = horizon // start_states[0].batch_size[1] if start_states else 0
        step_infos: StepInfos = {}  # step -> row -> info of an episode's last step
        ready, self._parked = self._parked, []
        num_groups = len(ready)
        self._bind(rollout)
        self._truncated.clear()
        self._position[:] = 0
        ended = torch.zeros(backend.num_rows, dtype=torch.bool) if until_done else None  # env ended an episode
        cut = None  # complete_episodes: each row's last slot of this rollout (-1: not yet)
        fresh = complete_episodes or 0  # new steps each row takes before it may be cut
        longest = (horizon - fresh) // 2  # H: the capacity is T + 2H
        if complete_episodes is not None:
            carry = self._carry(rollout)
            begin, padding = carry.length.copy(), carry.delivered.copy()
            carry.restore(rollout, self.raw_reward)
            self._position[:] = begin
            step_infos, carry.step_infos = carry.step_infos, {}
            if carry.truncated is not None:
                self._truncated.append((*carry.truncated, []))
            cut = np.full(backend.num_rows, -1, dtype=np.int64)
        while len(self._parked) < num_groups:
            resumed = bool(ready)  # parked since the last rollout: its obs is current, no step result to record
            batch = ready.pop() if resumed else backend.recv()
            if (backend.restarted or backend.worker_restarts) and self.take_restarts is not None:
                self.take_restarts(backend.restarted, backend.worker_restarts)
            views = self._views_for(rollout, batch, start_states)
            t = int(self._position[batch.rows.start])
            if not resumed:
                if backend.failed_rows:  # its worker died taking this step (recreate_failed_workers)
                    self._failed_step(batch, views, t - 1)
                self._record_step(batch, views, t - 1, step_infos)
                if ended is not None:
                    self._mark_ended(ended[batch.rows], views, t - 1)
                if cut is not None and t - begin[batch.rows.start] >= fresh:
                    self._mark_cut(cut[batch.rows], views, t - 1)
            # T steps taken (or, until_done, every env of the group has ended an episode; or, with
            # complete_episodes, every row has its cut): act on the current obs for its extras only
            # (the bootstrap; the action is not taken, so it is not sampled: no random draw is
            # spent) and park until the next rollout
            parking = t == horizon or (ended is not None and t > 0 and bool(ended[batch.rows].all()))
            if cut is not None:
                parking = bool((cut[batch.rows] >= 0).all())
                # every row's episode ends within H steps (one more: a next-step reset) of its T-th new step
                if not parking and t - begin[batch.rows.start] > fresh + longest:
                    raise self._too_long(longest)
            obs = views["obs"][t].copy_(batch.obs)
            mask = None if batch.action_mask is None else views["action_mask"][t].copy_(batch.action_mask)
            critic_obs = None if self.critic is None else self.critic.write(batch, obs, views["critic_obs"][t])
            if not policies.single:
                views["policy_id"][t].copy_(policies.row_policy[batch.rows])
            views["first"][t].copy_(views["first_now"])
            if segment and t % segment == 0 and t < horizon:
                for p, stored in views["start_states"]:
                    stored[t // segment].update_(policies.state(p, batch.rows))
            if not parking or self.extras:  # parked with no extras to store (replay learners): no forward pass
                action, _ = policies.act(
                    obs,
                    views["first_now"],
                    mask,
                    batch.rows,
                    deterministic=parking,
                    out=views["extras"][t],
                    critic_obs=critic_obs,
                    advance=not parking,
                )
            if parking:
                self._parked.append(batch)
                if t < horizon:
                    self._pad(rollout, batch.rows, t, horizon)
                continue
            if backend.logs_actions:  # external clients may have taken actions of their own
                action = backend.logged(action, batch)
            if action.is_floating_point() and not bool(torch.isfinite(action).all()):  # one read per step
                raise self._non_finite_action(action, batch, obs)
            views["action"][t].copy_(action)
            backend.send(action, batch)
            self._position[batch.rows] = t + 1
        if cut is None:
            self.truncations = self._gather_truncations(rollout, horizon)
            steps = backend.num_envs * horizon if ended is None else int(self._position.sum()) // backend.rows_per_env
        else:
            step_infos = self._carry_over(rollout, horizon, cut, step_infos)
            steps = int((cut + 1 - padding).sum()) // backend.rows_per_env
        self._track(rollout, horizon, step_infos)
        self._check_env_outputs(rollout, horizon)
        self.env_steps += steps
        self.sample_time_s += time.perf_counter() - start
        return steps

    def _carry(self, rollout: TensorDict) -> EpisodeCarry:
        if self.carry is None:
            self.carry = EpisodeCarry(self.backend.num_rows, (*self._written(rollout), *self.extras))
        return self.carry

    def _mark_cut(self, cut: npt.NDArray[np.int64], views: dict[str, Any], t: int) -> None:
        """Complete episodes: rows (of a batch, past their T new steps) whose env ended an episode
        at step ``t`` and have no cut yet are cut there."""
        done = views["terminated_np"] | views["truncated_np"]
        k = self.backend.rows_per_env
        if k > 1:
            done = np.repeat(env_episode_ends(done, views["valid_np"], k), k)
        cut[done & (cut < 0)] = t

    def _too_long(self, longest: int) -> EnvError:
        return EnvError(
            f"env '{self.backend.name}' ran an episode longer than {longest} steps, the longest that "
            f"batch_mode='complete_episodes' was sized for (`horizon`, else the env's declared limit); set "
            f"horizon=H to end episodes after H steps, or use batch_mode='truncate_episodes' for this env."
        )

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
        truncations = self._gather_truncations(rollout, horizon)  # after keep(): next-step ones read the flags
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
            )

    def _record_step(self, batch: StepBatch, views: dict[str, Any], t: int, step_infos: StepInfos) -> None:
        """Write the result of step ``t`` (reward, flags, truncated episodes' last observations) for
        ``batch``'s rows, and which rows start an episode now."""
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
        mark_episode_starts(done, batch.valid, self.backend.autoreset, self.backend.rows_per_env, views["first_now"])
        if self.backend.final_infos:  # only at episode ends, and only when an env sets infos
            step_infos.setdefault(t, {}).update(self.backend.final_infos)
        if self.backend.autoreset == "same_step" and views["truncated_np"].any():
            local = batch.truncated.nonzero().squeeze(-1)
            rows = local + batch.rows.start
            critic = None if self.critic is None else self.critic.final(batch, local)
            # the policies' state after acting at t: what a recurrent policy saw the last observation with
            states = [state[rows] for state in self.policies.states] if self.policies.stateful else []
            self._truncated.append((rows, torch.full_like(rows, t), batch.final_obs[local].clone(), critic, states))
        if not self.policies.single and (views["terminated_np"].any() or views["truncated_np"].any()):
            self._start_episodes(batch, views)

    def _mark_ended(self, ended: torch.Tensor, views: dict[str, Any], t: int) -> None:
        """Set ``ended`` (a batch's rows) where the row's env ended an episode at step ``t``: every
        agent still acting is done (one done row, for single-agent envs)."""
        k = self.backend.rows_per_env
        if k == 1:
            ended.logical_or_(views["done"][t])
            return
        envs = env_episode_ends(views["done"][t].numpy(), views["valid_np"], k)
        ended.logical_or_(torch.from_numpy(envs).repeat_interleave(k))

    def _pad(self, rollout: TensorDict, rows: slice, t: int, horizon: int) -> None:
        """Slots ``t..T-1`` of ``rows`` were not stepped: padding, masked from every loss and from the
        episode statistics (no flags, zero reward)."""
        for key in ("valid", "done", "terminated", "truncated"):
            rollout[key][rows, t:horizon] = False
        rollout["reward"][rows, t:horizon] = 0.0
        self.raw_reward[rows, t:horizon] = 0.0

    def _gather_truncations(self, rollout: TensorDict, horizon: int) -> Truncations:
        critic = rollout.get("critic_obs", None)
        if self.backend.autoreset == "next_step":  # the true final obs is the next step's obs, already stored
            row, step = rollout["truncated"][:, :horizon].nonzero().unbind(1)
            obs, critic_obs = rollout["obs"][row, step + 1], None if critic is None else critic[row, step + 1]
            return Truncations(row, step, obs, critic_obs, [], next_step=True)
        if not self._truncated:
            none = torch.zeros(0, dtype=torch.long)
            return Truncations(none, none, rollout["obs"][:0, 0], None if critic is None else critic[:0, 0], [])
        rows, steps, obs, critics, states = zip(*self._truncated)
        return Truncations(
            torch.cat(rows),
            torch.cat(steps),
            torch.cat(obs),
            None if critic is None else torch.cat(critics),
            [cast(TensorDict, torch.cat(per_policy)) for per_policy in zip(*states)],
        )

    def _start_episodes(self, batch: StepBatch, views: dict[str, Any]) -> None:
        """Envs whose episode ended this step (an agent finished and none is left acting) start a
        new one: their agents are mapped to policies again."""
        k = self.backend.rows_per_env
        done = views["terminated_np"] | views["truncated_np"]
        ended = np.flatnonzero(env_episode_ends(done, views["valid_np"], k)) + batch.rows.start // k
        self.policies.start_episodes(ended, self.backend.first_env_id)

    def _failed_step(self, batch: StepBatch, views: dict[str, Any], t: int) -> None:
        """The batch's rows whose worker died during step ``t`` end their episode there as a
        truncation from the observation the step was taken from (the backend wrote the flags)."""
        mine = [r for r in self.backend.failed_rows if batch.rows.start <= r < batch.rows.stop]
        if not mine:
            return
        local = torch.tensor(mine) - batch.rows.start
        batch.final_obs[local] = views["obs"][t][local]
        self.backend.failed_rows[:] = [r for r in self.backend.failed_rows if r not in mine]

    def _non_finite_action(self, action: torch.Tensor, batch: StepBatch, obs: torch.Tensor) -> ShoalError:
        """Caught before the env sees it: the policy is at fault, unless the env's observation was
        not finite already."""
        row = int((~torch.isfinite(action)).reshape(len(action), -1).any(1).nonzero()[0])
        policy = self.policies.ids[int(self.policies.row_policy[batch.rows][row])]
        env_id = int(self.backend.batch.env_id[batch.rows][row])
        if obs.is_floating_point() and not bool(torch.isfinite(obs[row]).all()):
            return EnvError(
                f"env '{self.backend.name}' (env {env_id}) returned a non-finite observation "
                f"({obs[row].flatten()[:8].tolist()}); observations must be finite."
            )
        value = action[row].flatten()[~torch.isfinite(action[row].flatten())][0].item()
        return TrainingDiverged(
            f"it chose a non-finite action ({value}) for env '{self.backend.name}' (env {env_id}); "
            f"the action was not sent to the env.",
            policy,
        )

    def _check_env_outputs(self, rollout: TensorDict, horizon: int) -> None:
        """The env's rewards, and its observations when they are floats, are finite: a NaN from the
        env is the env's fault, and must not reach the learner to be taken for a diverged update."""
        obs = rollout["obs"]
        if obs.is_floating_point() and not bool(torch.isfinite(obs).all()):
            row, step = (~torch.isfinite(obs)).reshape(*obs.shape[:2], -1).any(-1).nonzero()[0].tolist()
            raise EnvError(
                f"env '{self.backend.name}' (env {int(self.backend.batch.env_id[row])}) returned a non-finite "
                f"observation ({obs[row, step].flatten()[:8].tolist()}) at step {step} of this rollout; "
                f"observations must be finite."
            )
        reward = rollout["reward"][:, :horizon]
        if not torch.isfinite(reward).all():
            row, step = (~torch.isfinite(reward)).nonzero()[0].tolist()
            env_id = int(self.backend.batch.env_id[row])
            raise EnvError(
                f"env '{self.backend.name}' (env {env_id}) returned a non-finite reward "
                f"({reward[row, step].item()}) at step {step} of this rollout; rewards must be finite floats."
            )

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
