"""Ray rollout workers as one backend: each worker is a Ray actor over its share of the run's envs,
and to the trainer the ``WorkerSet`` is the backend of all of them. The envs never step here: the
driver's collector (``shoal.collect.remote.RemoteCollector``) has each actor sample its share with
its own copy of the policies; the actor's body (``shoal.collect.rollout_worker.RolloutWorker``) is
given to the ``WorkerSet``, which starts, resets, calls, replaces and closes the actors.

A worker whose actor dies stops the run, or with ``recreate_failed_workers`` is replaced by a new
actor over the same envs with new seeds: the episodes its rows had under way are forgotten, the
new actor is called again, and the trainer counts the replacement against its restart budget.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import gymnasium as gym
import torch
from tensordict import TensorDict

from shoal.config import TrainerConfig
from shoal.envs.registry import registered_creator
from shoal.errors import ConfigError, EnvError
from shoal.models.policy import Policy
from shoal.vector.base import Seed, VecBackend, env_seeds, mixed_seed
from shoal.vector.build import build_backend
from shoal.vector.vmas import is_vmas

Weights = dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]]  # policy id -> (state dict, synced attributes)
Storage = tuple[TensorDict, list[TensorDict]]  # a worker's share of the rollout and of each policy's start states


def ray_module() -> Any:
    """The ``ray`` package, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("backend='ray' needs Ray: pip install 'shoal[ray]'.") from None
    return ray


# The last part of a new actor's env seeds (run seed, worker, incarnation, RESET): its RNGs' seed lacks it
RESET = 1


class WorkerSet(VecBackend):
    """The Ray rollout workers of a run. To the trainer it is the backend of all their envs (the
    flat batch's layout, from one env made here); they never step here: ``RemoteCollector`` has
    the workers sample them."""

    unsaved_state = "envs run in Ray actors"
    ATTEMPTS = 3  # with recreate_failed_workers: a worker whose actors die this many times in one call stops the run
    START_TIMEOUT_S = 300.0  # a new actor that cannot start (or build its envs) in this time stops the run

    def __init__(self, config: TrainerConfig, worker: type):
        """``worker``: the body of each actor, built as ``worker(config, index, incarnation,
        first_env, num_envs, gym_spec)`` and called through ``start``, ``reset``, ``sample``,
        ``state_dict``, ``load_state_dict`` and ``close``."""
        c = config
        if is_vmas(c.env) or isinstance(c.env, gym.vector.VectorEnv):
            raise ConfigError(
                "backend='ray' makes each worker's envs one by one; a VMAS scenario or a Gymnasium VectorEnv "
                "steps its envs as one batch in one process: use backend='local'."
            )
        self.ray = ray_module()
        probe = build_backend(c.model_copy(update={"recreate_failed_workers": False}), 1)  # no workers here
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
            turn_based=probe.turn_based,
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
        # SPREAD: Ray's default fills the driver's node up to half its CPUs before using another, so
        # the workers of a run on a big head node would all sit on it, share its cores and die with it.
        # No task events: Ray's GCS keeps one (about 3 KB) per call, up to 100,000 of them; with a
        # call per worker per iteration it grew 110 MB in an hour of benchmarks/soak.py
        self.actor_class = self.ray.remote(
            num_cpus=c.num_cpus_per_worker, max_restarts=0, scheduling_strategy="SPREAD", enable_task_events=False
        )(worker)
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
    ) -> list[Any]:
        """Every worker's fragment of the next rollout (what its ``sample`` returns), acting with
        ``weights``; a worker is sent its share of ``rollout`` and ``start_states`` with its first
        call on this storage, and fills its own copy from then on."""
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
