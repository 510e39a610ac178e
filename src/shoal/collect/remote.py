"""Rollout workers as Ray actors, the collector's side: each worker steps its share of the envs
and acts on them with its own copy of the policies, through the same collector a local run uses,
and the driver gathers their fragments into the one rollout the algorithm learns from.

    driver  RemoteCollector.collect(rollout): the policies' weights go to Ray's object store once;
            every worker samples its rows; each fragment is written into rollout[its rows]
    worker  RolloutWorker.sample (``shoal.collect.rollout_worker``): load the weights,
            Collector.collect over its [rows, T+1] share

Workers act themselves, rather than stepping envs for a central policy, because a round trip to
an actor costs about a millisecond, more than most env steps: this way one round trip per worker
per iteration carries ``T`` steps of all its envs, and the workers may run on other machines. The
actors themselves, and the replacement of one that dies, are the backend's
(``shoal.vector.ray_workers.WorkerSet``).

Counting: a worker's fragment holds ``T`` steps of each of its rows, so an iteration gathers
exactly ``train_batch_size`` steps and discards none. A replaced worker samples the fragment
again, and only fragments that arrive are counted, so no step is lost from the counters or
counted twice. With ``restart_failed_envs`` a worker makes its failed envs anew itself, as a local
run does, and its fragment tells the trainer which.

Episodes are counted on the driver from the gathered raw rewards, as in a local run, so metrics
and ``on_episode_end`` callbacks are the same. The envs, the reward-scaling statistics and the
recurrent state live in the actors; checkpoints save the last two, not the envs, so a resumed run
starts new episodes (as with worker processes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from shoal.collect.collector import FIELDS, Collector
from shoal.collect.episodes import EpisodeTracker, StepInfos
from shoal.collect.policies import PolicyMap
from shoal.collect.truncations import Truncations, join_truncations
from shoal.errors import warn
from shoal.vector.base import Seed
from shoal.vector.ray_workers import Storage, Weights, WorkerSet

# what a collector writes besides the extras; the rest of the rollout is the learner's
WRITTEN = (*FIELDS, "action_mask", "critic_obs", "info", "env_done")


@dataclass
class Fragment:
    """What a worker sends back from one ``sample``: its share of the rollout, filled."""

    steps: int
    seconds: float  # spent collecting, in the worker
    storage: Storage
    truncations: Truncations
    raw_reward: torch.Tensor  # [rows, T]: the env's rewards before scaling and clipping
    step_infos: StepInfos  # rows numbered within the worker
    restarted: list[tuple[int, str]]  # (env id, error) of each env made anew (restart_failed_envs)


class RemoteCollector(Collector):
    """A collector whose envs step in Ray rollout workers (a ``WorkerSet``): the same calls fill
    the same rollout, and episodes are counted here."""

    def __init__(self, workers: WorkerSet, policies: PolicyMap, tracker: EpisodeTracker, extras: tuple[str, ...]):
        super().__init__(workers, policies, tracker, extras)
        self.workers = workers
        self._overhead_s = 0.0
        workers.start(dict(zip(policies.ids, policies.modules)), extras)

    def reset(self, seed: Seed) -> None:
        self.workers.reset(seed)
        assert self.tracker is not None  # the driver's collector always counts episodes
        self.tracker.reset_episodes()

    def collect(
        self,
        rollout: TensorDict,
        start_states: list[TensorDict] | None = None,
        until_done: bool = False,
        complete_episodes: int | None = None,
    ) -> int:
        start = time.perf_counter()
        horizon = rollout.batch_size[1] - 1
        self._bind(rollout)
        weights: Weights = {
            pid: (
                {key: value.cpu() for key, value in policy.state_dict().items()},
                {name: getattr(policy, name) for name in policy.synced_attributes},
            )
            for pid, policy in zip(self.policies.ids, self.policies.modules)
        }
        fragments: list[Fragment] = self.workers.sample(
            weights, rollout, start_states or [], until_done, complete_episodes
        )
        assert self.tracker is not None
        replaced, self.workers.replaced = self.workers.replaced, []
        for w in replaced:
            self.tracker.reset_episodes(self.workers.shares[w])
        for fragment in fragments:
            self.workers.restarted.extend(fragment.restarted)
        if (self.workers.restarted or self.workers.worker_restarts) and self.take_restarts is not None:
            self.take_restarts(self.workers.restarted, self.workers.worker_restarts)
        step_infos: StepInfos = {}
        for rows, fragment in zip(self.workers.shares, fragments):
            share, states = fragment.storage
            rollout[rows].update_(share.to(rollout.device))
            for stored, part in zip(start_states or [], states):
                stored[rows] = part.to(stored.device)
            self.raw_reward[rows, :horizon] = fragment.raw_reward
            for t, infos in fragment.step_infos.items():
                step_infos.setdefault(t, {}).update({rows.start + row: info for row, info in infos.items()})
        parts = [(rows.start, fragment.truncations) for rows, fragment in zip(self.workers.shares, fragments)]
        self.truncations = join_truncations(parts, rollout["reward"].device)
        self._track(rollout, horizon, step_infos)
        steps = sum(f.steps for f in fragments)
        self.env_steps += steps
        elapsed = time.perf_counter() - start
        self.sample_time_s += elapsed
        self._overhead_s += elapsed - max(fragment.seconds for fragment in fragments)
        return steps

    def iteration_stats(self) -> dict[str, float]:
        """``remote_overhead_ms``: the iteration's sampling time beyond the slowest worker's own
        collecting (sending weights, the calls, moving fragments)."""
        overhead, self._overhead_s = self._overhead_s, 0.0
        return {"remote_overhead_ms": 1e3 * overhead}

    def state_dict(self) -> dict[str, Any]:
        """A local collector's state (so the checkpoint also loads into a run with local envs, as
        ``shoal eval`` makes), and each worker's, unless one died and the run is stopping: then the
        learner is saved alone, and a resumed run's workers start with fresh statistics."""
        workers = [] if self.workers.lost else self.workers.worker_states()
        return super().state_dict() | {"workers": workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.tracker is not None
        self.tracker.load_state_dict(state["tracker"])
        self.env_steps = state["env_steps"]
        saved = state.get("workers", [])
        if len(saved) == len(self.workers.workers):
            self.workers.load_worker_states(saved)
            return
        if "workers" not in state:
            why = "the checkpoint was written by a run without Ray workers"
        elif not saved:
            why = "the checkpoint was written as a Ray worker died and holds no worker's state"
        else:
            why = f"the checkpoint holds {len(saved)} Ray workers' state and this run has {len(self.workers.workers)}"
        warn(f"{why}; the workers start with fresh reward statistics and recurrent state.")
