"""Rollout workers as Ray actors: each steps its share of the envs and acts on them with its own
copy of the policies, through the same collector a local run uses, and the driver gathers their
fragments into the one rollout the algorithm learns from.

    driver  RemoteCollector.collect(rollout): the policies' weights go to Ray's object store once;
            every worker samples its rows; each fragment is written into rollout[its rows]
    worker  RolloutWorker.sample: load the weights, Collector.collect over its [rows, T+1] share

Workers act themselves, rather than stepping envs for a central policy, because a round trip to
an actor costs about a millisecond, more than most env steps: this way one round trip per worker
per iteration carries ``T`` steps of all its envs, and the workers may run on other machines.

Counting: a worker's fragment holds ``T`` steps of each of its rows, so an iteration gathers
exactly ``train_batch_size`` steps and discards none. A worker whose actor dies stops the run, or
with ``recreate_failed_workers`` is replaced by a new actor over the same envs with new seeds: the
episodes its rows had under way are forgotten, the new actor samples the fragment again, and the
trainer counts the replacement against its restart budget. Only fragments that arrive are counted,
so no step is lost from the counters or counted twice. With ``restart_failed_envs`` a worker makes
its failed envs anew itself, as a local run does, and its fragment tells the trainer which.

Episodes are counted on the driver from the gathered raw rewards, as in a local run, so metrics
and ``on_episode_end`` callbacks are the same. The envs, the reward-scaling statistics and the
recurrent state live in the actors; checkpoints save the last two, not the envs, so a resumed run
starts new episodes (as with worker processes).
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import torch
from tensordict import TensorDict

from shoal.collect import Collector, EpisodeTracker
from shoal.collect.collector import FIELDS, Truncations
from shoal.collect.episodes import StepInfos
from shoal.collect.policies import PolicyMap
from shoal.config import TrainerConfig
from shoal.envs.registry import registered_creator
from shoal.errors import ConfigError, EnvError
from shoal.models.policy import Policy
from shoal.train import faults, setup
from shoal.vector import VecBackend
from shoal.vector.base import Seed, env_seeds, mixed_seed
from shoal.vector.vmas import is_vmas

Weights = dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]]  # policy id -> (state dict, synced attributes)
Storage = tuple[TensorDict, list[TensorDict]]  # a worker's share of the rollout and of each policy's start states
WRITTEN = (
    *FIELDS,
    "action_mask",
    "critic_obs",
    "info",
)  # what a collector writes besides the extras; the rest is the learner's


def ray_module() -> Any:
    """The ``ray`` package, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("backend='ray' needs Ray: pip install 'shoal[ray]'.") from None
    return ray


# The last part of a new actor's env seeds (run seed, worker, incarnation, RESET): its RNGs' seed lacks it
RESET = 1


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


class RolloutWorker:
    """The body of one Ray actor: envs ``first_env .. first_env + num_envs - 1`` of the run, a copy
    of the policies and a collector over them."""

    def __init__(
        self,
        config: TrainerConfig,
        index: int,
        incarnation: int,
        first_env: int,
        num_envs: int,
        gym_spec: gym.envs.registration.EnvSpec | None = None,
    ):
        """``gym_spec``: the Gymnasium registration of the env id, for ids the driver registered
        itself (a fresh process does not know them)."""
        torch.set_num_threads(config.torch_threads)
        setup.seed_everything(mixed_seed(config.seed, index, incarnation))
        if gym_spec is not None and gym_spec.id not in gym.registry:
            gym.registry[gym_spec.id] = gym_spec
        self.config = config
        self.policies: dict[str, Policy] = {}
        self.collector: Collector | None = None
        self.storage: dict[int, Storage] = {}
        self.restarted: list[tuple[int, str]] = []  # envs made anew since the last fragment
        # An env that fails to build is reported by start() as the env's error: raised here, it
        # would look like the actor dying, which the driver answers with a replacement.
        self.error: Exception | None = None
        try:
            self.backend = setup.build_backend(config, num_envs, first_env_id=first_env)
        except Exception as e:
            self.error = e

    def start(self, policies: dict[str, Policy], extras: tuple[str, ...]) -> None:
        if self.error is not None:
            raise self.error
        c = self.config
        critic = setup.central_critic(c.central_critic, self.backend, self.backend.name)
        policy_map = setup.policy_map(policies, self.backend, c.policy_mapping_fn)
        self.policies = policies
        self.collector = setup.collector(c, self.backend, policy_map, None, extras, critic)
        self.collector.take_restarts = self._take_restarts
        # the trainer's budget, kept here too: a crash loop stops as it happens, not after the fragment
        self.budget = faults.EnvRestarts(c.max_restarts_per_hour, self.backend.name, warn=False)

    def _take_restarts(self, envs: list[tuple[int, str]], workers: list[str]) -> None:
        """Keep the envs made anew for the next fragment (the driver's trainer warns and counts them)."""
        self.restarted.extend(envs)
        self.budget.take(envs, workers)  # (empties both; no workers: the worker's envs step in its process)

    def _collector(self) -> Collector:
        if self.collector is None:
            raise RuntimeError("RolloutWorker.start(policies, extras) must be called first")
        return self.collector

    def reset(self, seed: Seed) -> None:
        self._collector().reset(seed)

    def sample(
        self,
        weights: Weights,
        key: int,
        storage: Storage | None,
        until_done: bool,
        complete_episodes: int | None = None,
    ) -> Fragment:
        """Act with ``weights`` on the next ``T`` steps (``storage``: the share to fill, sent once per key)."""
        collector = self._collector()
        for pid, (state, attributes) in weights.items():
            policy = self.policies[pid]
            policy.load_state_dict(state)
            for name, value in attributes.items():
                setattr(policy, name, value)
        if storage is not None:
            self.storage[key] = storage
        rollout, start_states = self.storage[key]
        start = time.perf_counter()
        steps = collector.collect(rollout, start_states or None, until_done, complete_episodes)
        seconds = time.perf_counter() - start
        horizon = rollout.batch_size[1] - 1
        truncations = collector.truncations
        assert truncations is not None  # collect() sets them
        raw_reward = collector.raw_reward[:, :horizon]
        written = rollout.select(*(key for key in WRITTEN if key in rollout.keys()), *collector.extras)  # noqa: SIM118
        restarted, self.restarted = self.restarted, []
        return Fragment(
            steps, seconds, (written, start_states), truncations, raw_reward, collector.step_infos, restarted
        )

    def state_dict(self) -> dict[str, Any]:
        return self._collector().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._collector().load_state_dict(state)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.error is None:
            self.backend.close()


class WorkerSet(VecBackend):
    """The Ray rollout workers of a run. To the trainer it is the backend of all their envs (the
    flat batch's layout, from one env made here); they never step here: ``RemoteCollector`` has
    the workers sample them."""

    unsaved_state = "envs run in Ray actors"
    ATTEMPTS = 3  # with recreate_failed_workers: a worker whose actors die this many times in one call stops the run
    START_TIMEOUT_S = 300.0  # a new actor that cannot start (or build its envs) in this time stops the run

    def __init__(self, config: TrainerConfig):
        c = config
        if is_vmas(c.env) or isinstance(c.env, gym.vector.VectorEnv):
            raise ConfigError(
                "backend='ray' makes each worker's envs one by one; a VMAS scenario or a Gymnasium VectorEnv "
                "steps its envs as one batch in one process: use backend='local'."
            )
        self.ray = ray_module()
        probe = setup.build_backend(c.model_copy(update={"recreate_failed_workers": False}), 1)  # no workers here
        mask, state, info = probe.batch.action_mask, probe.batch.state, probe.batch.info
        super().__init__(
            probe.name,
            c.num_envs,
            probe.obs_spec,
            probe.act_spec,
            probe.rows_per_env,
            mask_size=0 if mask is None else mask.shape[1],
            state_size=0 if state is None else state.shape[1],
            info_size=0 if info is None else info.shape[1],
        )
        self.agents, self.autoreset = probe.agents, probe.autoreset
        del probe  # not closed: it may hold the user's own env instance
        # what the actors get: the config without what only the driver uses (callbacks, device, cluster)
        self.worker_config = c.model_copy(
            update={
                "backend": "local",
                "ray_address": None,
                "num_workers": 0,
                "callbacks": [],
                "recreate_failed_workers": False,  # the driver replaces dead workers; inside, envs step in-process
                "device": "cpu",
                "env": registered_creator(c.env) or c.env,  # a fresh process does not know shoal.register_env names
            }
        )
        self.owns_ray = not self.ray.is_initialized()
        if self.owns_ray:
            self.ray.init(address=c.ray_address, include_dashboard=False)
        self._check_resources(c)
        self.env_spec = gym.registry.get(c.env) if isinstance(c.env, str) else None
        self.actor_class = self.ray.remote(num_cpus=c.num_cpus_per_worker, max_restarts=0)(RolloutWorker)
        self.envs_per_worker = c.num_envs // c.num_workers
        self.first_envs = [w * self.envs_per_worker for w in range(c.num_workers)]
        k = self.rows_per_env
        self.shares = [slice(e * k, (e + self.envs_per_worker) * k) for e in self.first_envs]
        """Each worker's agent rows of the flat batch."""
        self.recreate = c.recreate_failed_workers
        self.incarnations = 0
        """Actors started to replace dead ones by this driver: each new one seeds its envs afresh."""
        self.lost = False
        """A worker died and has no working replacement: the run stops, and no worker's state is saved."""
        self.replaced: list[int] = []
        """Workers replaced since the driver's collector last looked: their envs start new episodes."""
        self.workers = [self._actor(w) for w in range(c.num_workers)]
        self._known: list[set[int]] = [set() for _ in self.workers]  # the storage keys each worker holds
        self._seeds: list[Seed] = [None] * c.num_workers  # each worker's last reset seed
        self._policies: dict[str, Policy] = {}
        self._extras: tuple[str, ...] = ()

    def _check_resources(self, config: TrainerConfig) -> None:
        """Actors that cannot be placed would wait forever: refuse a request the cluster cannot hold."""
        needed = config.num_workers * config.num_cpus_per_worker
        envs = config.num_envs * config.num_cpus_per_env if config.remote_worker_envs else 0.0
        total = float(self.ray.cluster_resources().get("CPU", 0.0))
        if needed + envs > total:
            self.close()
            asked = f" + num_envs={config.num_envs} x num_cpus_per_env={config.num_cpus_per_env:g}" if envs else ""
            raise ConfigError(
                f"backend='ray' asks for num_workers={config.num_workers} x num_cpus_per_worker="
                f"{config.num_cpus_per_worker:g}{asked} = {needed + envs:g} CPUs, and the Ray cluster has {total:g}; "
                f"use fewer workers or envs, or fewer CPUs for each."
            )

    def _actor(self, w: int) -> Any:
        c = self.worker_config
        return self.actor_class.remote(c, w, self.incarnations, self.first_envs[w], self.envs_per_worker, self.env_spec)

    def start(self, policies: dict[str, Policy], extras: tuple[str, ...]) -> None:
        """Give every worker its copy of ``policies`` (on the CPU) and the extras to store."""
        self._policies = {pid: copy.deepcopy(policy).cpu() for pid, policy in policies.items()}
        self._extras = extras
        self._each(lambda w: self.workers[w].start.remote(self._policies, extras))

    def reset(self, seed: Seed = None) -> None:
        """Reset every worker's envs: each env gets the seed it would get in a local run."""
        per_env = None if seed is None or isinstance(seed, int) else env_seeds(seed, self.num_envs, 0, self.name)
        # (a list of seeds holds ints only: env_seeds checked it)

        for w, first in enumerate(self.first_envs):
            self._seeds[w] = seed if per_env is None else cast(list[int], per_env[first : first + self.envs_per_worker])
        self._each(lambda w: self.workers[w].reset.remote(self._seeds[w]))

    def sample(
        self,
        weights: Weights,
        rollout: TensorDict,
        start_states: list[TensorDict],
        until_done: bool,
        complete_episodes: int | None,
    ) -> list[Fragment]:
        """Every worker's fragment of the next rollout, acting with ``weights``."""
        ref = self.ray.put(weights)  # once: every worker reads the same copy from the object store
        key = hash((id(rollout), tuple(rollout.batch_size), tuple(sorted(map(str, rollout.keys(True))))))

        def call(w: int) -> Any:
            share = None
            if key not in self._known[w]:  # the worker's first rollout of this storage: send its share
                rows = self.shares[w]
                share = (rollout[rows].clone().cpu(), [states[rows].clone().cpu() for states in start_states])
                self._known[w].add(key)
            return self.workers[w].sample.remote(ref, key, share, until_done, complete_episodes)

        return self._each(call)

    def _each(self, call: Callable[[int], Any]) -> list[Any]:
        """``call(w)`` (a remote call) for every worker at once, then each result. A worker whose
        actor died stops the run, or with ``recreate_failed_workers`` is replaced and called again.
        An exception the call raises (an env's) is not a death: it comes through, with its traceback."""
        pending = [call(w) for w in range(len(self.workers))]
        results = []
        for w, ref in enumerate(pending):
            error: Exception | None = None
            for _ in range(self.ATTEMPTS):
                try:
                    if error is not None:
                        self._replace(w, error)
                        ref = call(w)
                    results.append(self.ray.get(ref))
                    break
                except self.ray.exceptions.RayActorError as e:
                    if not self.recreate:
                        self.lost = True
                        raise EnvError(
                            f"{self._died(w, e)}; set recreate_failed_workers=True to replace a dead worker "
                            f"with a new actor and keep going."
                        ) from None
                    error = e
            else:
                self.lost = True
                raise EnvError(f"{self._died(w, error)}, {self.ATTEMPTS} times in a row") from None
        return results

    def _died(self, w: int, error: Exception | None) -> str:
        first, text = self.first_envs[w], str(error).strip()
        cause = text.splitlines()[0].rstrip(".") if text else type(error).__name__
        return (
            f"Ray rollout worker {w} (envs {first}-{first + self.envs_per_worker - 1} of '{self.name}') died ({cause})"
        )

    def _replace(self, w: int, error: Exception) -> None:
        """A new actor over worker ``w``'s envs, started and reset like the one that died: with new
        seeds, unless the last reset gave each env its own (an algorithm's chosen starts, as GRPO's
        groups), which the new envs then start from again. The trainer takes the death from
        ``worker_restarts``: it warns, counts it and keeps to the restart budget."""
        self.incarnations += 1
        self.worker_restarts.append(f"{self._died(w, error)}; the episodes its envs had under way are dropped")
        actor = self.workers[w] = self._actor(w)
        self._known[w] = set()
        self.replaced.append(w)
        if not self._policies:  # not started yet: start() starts it with the others
            return
        self.lost = True  # until the new actor has started: a failure on the way stops the run without its state
        seed = self._seeds[w]
        new_seed = seed if isinstance(seed, list) else mixed_seed(self.worker_config.seed, w, self.incarnations, RESET)
        try:
            self.ray.get(actor.start.remote(self._policies, self._extras), timeout=self.START_TIMEOUT_S)
            self.ray.get(actor.reset.remote(new_seed), timeout=self.START_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:  # not placed (a lost node took its CPUs), or its envs hang
            self.ray.kill(actor)
            free, needed = self.ray.available_resources().get("CPU", 0.0), self.worker_config.num_cpus_per_worker
            raise EnvError(
                f"{self._died(w, error)}, and its new actor did not start and build its envs within "
                f"{self.START_TIMEOUT_S:g} s (it needs num_cpus_per_worker={needed:g} CPUs; {free:g} are free)."
            ) from None
        self.lost = False

    def worker_states(self) -> list[dict[str, Any]]:
        """Each worker's collector state (reward statistics, recurrent state, policy assignment)."""
        return self._each(lambda w: self.workers[w].state_dict.remote())

    def load_worker_states(self, states: list[dict[str, Any]]) -> None:
        self._each(lambda w: self.workers[w].load_state_dict.remote(states[w]))

    def close(self) -> None:
        workers = getattr(self, "workers", [])  # (none yet when the resource check fails)
        closing = [actor.close.remote() for actor in workers]  # the envs close (simulators are told)
        self.ray.wait(closing, num_returns=len(closing), timeout=10.0)
        for actor in workers:
            self.ray.kill(actor)
        self.workers = []
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()


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
        fragments = self.workers.sample(weights, rollout, start_states or [], until_done, complete_episodes)
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
        warnings.warn(f"{why}; the workers start with fresh reward statistics and recurrent state.", stacklevel=2)


def join_truncations(parts: list[tuple[int, Truncations]], device: torch.device) -> Truncations:
    """The truncations of several workers' shares (each with its first row) as one rollout's."""
    first = parts[0][1]
    cut = [t for _, t in parts if len(t)]  # a share without truncations may list no states
    return Truncations(
        torch.cat([t.row + offset for offset, t in parts]).to(device),
        torch.cat([t.step for _, t in parts]).to(device),
        torch.cat([t.obs for _, t in parts]).to(device),
        None if first.critic_obs is None else torch.cat([t.critic_obs for _, t in parts]).to(device),  # type: ignore[misc]
        [cast(TensorDict, torch.cat(states)).to(device) for states in zip(*(t.states for t in cut))],
        first.next_step,
    )
