"""``remote_worker_envs``: each env of a Ray rollout worker is an actor of its own.

For envs whose step is slow (a simulator in another process, a game server), a worker that steps
its envs one after another waits for each in turn. Here every env is an ``EnvActor``: the worker
sends each env its action at once (``send``), and ``recv`` polls the steps under way and returns
the first group of envs (``async_factor`` groups) whose steps have all completed, so the policy
acts on those envs with one forward pass while the others still step. The worker's collector,
policies and counting are unchanged: this is one more backend.

An ``EnvActor`` is a serial backend of one env, built from the run's config like any other, so
its wrappers, seeding (env ``i`` gets ``seed + i``), autoreset, info keys and error messages are
those of a local env. Each step returns that env's rows of the flat batch. Actors reserve no CPU
by default (``num_cpus_per_env``): an env worth running remotely mostly waits.
"""

from __future__ import annotations

import os
import sys
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from shoal.config import TrainerConfig
from shoal.envs.registry import env_name
from shoal.errors import ConfigError, EnvError
from shoal.vector.agents import AgentEnvBackend
from shoal.vector.base import Seed, StepBatch, VecBackend, batch_view, env_seeds, seed_everything
from shoal.vector.build import build_backend
from shoal.vector.ray_workers import ray_module
from shoal.vector.serial import SerialBackend

Rows = dict[str, npt.NDArray[Any]]  # an env's rows of the flat-batch arrays, by field


class EnvActor:
    """The body of one env's Ray actor: a one-env serial backend of env ``env_id``."""

    def __init__(self, config: TrainerConfig, env_id: int):
        seed_everything(config.seed + 100_003 * (env_id + 1))  # envs drawing from the global generators
        local = config.model_copy(update={"remote_worker_envs": False})
        # envs made one by one (the config refuses VMAS and vectorization_mode): a serial backend
        self.backend = cast(SerialBackend | AgentEnvBackend, build_backend(local, 1, first_env_id=env_id))

    def layout(self) -> dict[str, Any]:
        """What the worker needs to lay out the batch: the env's name, specs, spaces, rows per
        env and agents, and each field's row shape and dtype."""
        b = self.backend
        return {
            "name": b.name,
            "specs": (b.obs_spec, b.act_spec),
            "spaces": (getattr(b, "single_observation_space", None), getattr(b, "single_action_space", None)),
            "rows_per_env": b.rows_per_env,
            "agents": b.agents,
            "fields": {key: (value.shape[1:], value.dtype.str) for key, value in b._buffers.items()},
        }

    def reset(self, seed: list[int] | None) -> Rows:
        self.backend.reset(seed)  # a list of one: this env's own seed, as the worker computed it
        return self._rows()

    def step(self, action: npt.NDArray[Any]) -> tuple[Rows, dict[int, dict[str, Any]]]:
        self.backend.step(action)
        return self._rows(), dict(self.backend.final_infos)

    def _rows(self) -> Rows:
        return {key: value.copy() for key, value in self.backend._buffers.items()}

    def close(self) -> None:
        self.backend.close()


class RemoteEnvBackend(VecBackend):
    """``num_envs`` env actors stepped in ``async_factor`` groups (see the module docstring)."""

    autoreset = "same_step"
    unsaved_state = "envs run in Ray actors"

    def __init__(self, config: TrainerConfig, num_envs: int, first_env_id: int = 0):
        self.ray = ray_module()
        self.name = env_name(config.env)  # until the first env reports its own
        self._started = False  # an env actor that fails to start is an error of the env, not a death
        if num_envs % config.async_factor:
            raise ConfigError(
                f"remote_worker_envs: each worker's {num_envs} envs must split into async_factor="
                f"{config.async_factor} equal groups."
            )
        # no task events: Ray's GCS would keep one (about 3 KB) for each of these per-step calls
        actor = self.ray.remote(num_cpus=config.num_cpus_per_env, max_restarts=0, enable_task_events=False)(EnvActor)
        self.actors = [actor.remote(config, first_env_id + i) for i in range(num_envs)]
        layout = self._get(self.actors[0].layout.remote())
        self._get([actor.layout.remote() for actor in self.actors[1:]])  # every env is built
        self._started = True
        k = layout["rows_per_env"]
        buffers = {
            key: np.zeros((num_envs * k, *shape), np.dtype(dtype)) for key, (shape, dtype) in layout["fields"].items()
        }
        obs, act = layout["specs"]
        super().__init__(layout["name"], num_envs, obs, act, k, buffers, first_env_id=first_env_id)
        self.agents = layout["agents"]
        self.single_observation_space, self.single_action_space = layout["spaces"]
        self.async_factor = config.async_factor
        per_group = num_envs // self.async_factor
        self.groups = [range(g * per_group, (g + 1) * per_group) for g in range(self.async_factor)]
        spans = [slice(g[0] * k, (g[-1] + 1) * k) for g in self.groups]
        self.batches = [batch_view(buffers, s, self.batch.env_id[s], self.batch.agent_id[s]) for s in spans]
        self._group_of = {id(b): g for g, b in enumerate(self.batches)}
        self._stepping: dict[int, list[Any]] = {}  # group -> its envs' step results under way
        self._ready: list[int] = []  # groups to hand out as they are, after a reset

    def _get(self, refs: Any) -> Any:
        """``ray.get``, with an env's own error (its env id, and the env actor's traceback) instead
        of Ray's wrapping. An env actor that died takes this worker down with it,
        so the run replaces the worker, fresh envs and all, as for any worker that dies."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, EnvError):  # the env's own message, then where it raised in its actor
                cause.args = (f"{cause}\n\nin its env actor:\n{e}",)
                raise cause from None
            raise EnvError(f"env '{self.name}': {e}") from None
        except self.ray.exceptions.RayActorError as e:
            if not self._started:
                raise EnvError(f"an env actor of '{self.name}' could not start: {e}") from None
            print(f"shoal: an env actor of '{self.name}' died ({e}); its worker stops to be replaced", file=sys.stderr)
            os._exit(1)

    def reset(self, seed: Seed = None) -> None:
        self._get([refs for refs in self._stepping.values() for refs in refs])  # let steps under way finish
        self._stepping.clear()
        seeds = env_seeds(seed, self.num_envs, self.first_env_id, self.name)
        resets = [a.reset.remote(None if s is None else [s]) for a, s in zip(self.actors, seeds)]
        for i, rows in enumerate(self._get(resets)):
            self._write(i, rows)
        self._ready = list(range(self.async_factor))

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        g = 0 if batch is None else self._group_of[id(batch)]
        acts = self.env_actions(actions)
        k = self.rows_per_env
        first = self.groups[g][0]
        self._stepping[g] = [
            self.actors[i].step.remote(acts[(i - first) * k : (i - first + 1) * k]) for i in self.groups[g]
        ]

    def recv(self) -> StepBatch:
        """The first group whose envs have all stepped (after a reset, each group as it is)."""
        if self._ready:
            return self.batches[self._ready.pop(0)]
        self.final_infos.clear()
        while True:
            for g, refs in self._stepping.items():
                done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
                if len(done) == len(refs):
                    del self._stepping[g]
                    for i, (rows, infos) in zip(self.groups[g], self._get(refs)):
                        self._write(i, rows)
                        self.final_infos.update({i * self.rows_per_env + slot: info for slot, info in infos.items()})
                    return self.batches[g]
            if not self._stepping:
                raise RuntimeError("RemoteEnvBackend.recv() with no step under way: send() actions first")
            # until one more env steps: wait on the steps not yet done (waiting on done ones returns at once)
            _, running = self.ray.wait(
                [ref for refs in self._stepping.values() for ref in refs], num_returns=1, timeout=0
            )
            if running:
                self.ray.wait(running, num_returns=1)

    def _write(self, env: int, rows: Rows) -> None:
        span = slice(env * self.rows_per_env, (env + 1) * self.rows_per_env)
        for key, value in rows.items():
            self._buffers[key][span] = value

    def close(self) -> None:
        """Close every env (a simulator is told), then end the actors."""
        closing = [actor.close.remote() for actor in self.actors]
        self.ray.wait(closing, num_returns=len(closing), timeout=10.0)
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
