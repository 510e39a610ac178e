"""Serial backend: K gym.Env instances stepped in this process, written straight into shared buffers.

It is also what each worker process of the multiprocessing backend runs, over its slice of
the shared-memory buffers (``buffers``, ``first_env_id``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch

from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import EnvError, ShoalError
from shoal.vector.base import Buffers, Seed, StepBatch, VecBackend, env_seeds, mixed_seed

RESTART_SEED_STRIDE = 1_000_003
"""A recreated worker process resets its envs from ``seed + stride x recreations``, so they get
``seed + stride x recreations + env id``: clear of the seeds of any run's envs and of each other."""


class SerialBackend(VecBackend):
    autoreset = "same_step"

    def __init__(
        self,
        make_env: Callable[[int], gym.Env[Any, Any]],
        num_envs: int,
        name: str,
        buffers: Buffers | None = None,
        first_env_id: int = 0,
        info_keys: tuple[str, ...] = (),
        restart_failed_envs: bool = False,
    ):
        """``info_keys``: the step infos' values written to the batch's ``info`` each step.
        ``restart_failed_envs``: an env that raises in ``step`` is made anew (see ``_restart``)."""
        self.make_env, self.restart_failed_envs = make_env, restart_failed_envs
        self.envs = [make_env(first_env_id + i) for i in range(num_envs)]
        first = self.envs[0]
        for i, env in enumerate(self.envs[1:], start=1):
            if env.observation_space != first.observation_space or env.action_space != first.action_space:
                raise EnvError(
                    f"env '{name}' copy {i} has spaces {env.observation_space} / {env.action_space}, "
                    f"copy 0 has {first.observation_space} / {first.action_space}; all copies must match."
                )
        super().__init__(
            name,
            num_envs,
            obs_spec(first.observation_space),
            action_spec(first.action_space),
            buffers=buffers,
            first_env_id=first_env_id,
            info_size=len(info_keys),
        )
        self.info_keys = info_keys
        self._restarts = 0
        self._restarted_rows: list[int] = []  # rows whose step was a restart (valid again next step)
        self._seed: int | None = None  # the last reset's seed, from which restarts draw theirs
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space

    def reset(self, seed: Seed = None) -> None:
        seeds = env_seeds(seed, self.num_envs, self.first_env_id, self.name)
        self._seed = seed if isinstance(seed, int) else None
        for i, (env, s) in enumerate(zip(self.envs, seeds)):
            try:
                obs, _ = env.reset(seed=s)
            except ShoalError:
                raise
            except Exception as e:
                raise self._failed(i, "reset", e) from e
            if s is not None:
                env.action_space.seed(s)
            self.obs_spec.write(self._obs[i], obs, self.name)
        self._terminated[:] = False
        self._truncated[:] = False

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        # numpy scalars: Gymnasium's Discrete.contains checks them fastest
        self.step(self.env_actions(actions))

    def step(self, acts: npt.NDArray[Any]) -> None:
        """Step every env with its row of ``acts`` (env-ready actions), autoresetting done ones."""
        write, name = self.obs_spec.write, self.name
        obs_buf, final_buf = self._obs, self._final_obs
        rew, term, trunc, final_infos = self._reward, self._terminated, self._truncated, self.final_infos
        info_rows = self._buffers.get("info")  # [envs, K] when info_keys are asked for
        if final_infos:
            final_infos.clear()
        if self._restarted_rows:  # restarted last step: this step is a transition again
            self._valid[self._restarted_rows] = True
            self._restarted_rows.clear()
        i = 0
        try:
            for i, env in enumerate(self.envs):
                try:
                    obs, r, te, tr, info = env.step(acts[i])
                except ShoalError:
                    raise
                except Exception as e:
                    if not self.restart_failed_envs:
                        raise
                    self._restart(i, e)
                    continue
                rew[i] = r
                term[i] = te
                trunc[i] = tr
                if info_rows is not None:
                    self._write_info(info_rows[i], info)
                if te or tr:
                    if info:
                        final_infos[i] = info
                    if tr:
                        write(final_buf[i], obs, name)
                    obs, _ = env.reset()
                write(obs_buf[i], obs, name)
        except ShoalError:
            raise
        except Exception as e:  # free when nothing is raised; names the env when something is
            raise self._failed(i, "step", e) from e

    def _restart(self, i: int, error: Exception) -> None:
        """Env ``i`` raised in ``step``: make it anew and reset it. Its failed step is written as a
        truncation that is not a transition (``valid`` False, reward 0, the last observation as the
        final one), so the learners bootstrap the step before it and skip this one, and the
        episode tracker drops the episode."""
        with contextlib.suppress(Exception):  # a broken env may fail to close too
            self.envs[i].close()
        try:
            self.envs[i] = env = self.make_env(self.first_env_id + i)
        except Exception as e:
            raise self._failed(i, "being made anew after a failure", e) from e
        self._restarts += 1
        # a fresh, reproducible start, mixed from the reset's seed, the restart and the env so that it
        # is clear of the envs' own seeds and of every other restart's, also across recreated workers
        env_id = self.first_env_id + i
        seed = None if self._seed is None else mixed_seed(self._seed, self._restarts, env_id)
        try:
            obs, _ = env.reset(seed=seed)
        except Exception as e:
            raise self._failed(i, "reset() after a restart", e) from e
        self._final_obs[i] = self._obs[i]
        self._reward[i], self._terminated[i], self._truncated[i], self._valid[i] = 0.0, False, True, False
        self.obs_spec.write(self._obs[i], obs, self.name)
        self._restarted_rows.append(i)
        self.restarted.append((self.first_env_id + i, f"{type(error).__name__}: {error}"))

    def _write_info(self, out: npt.NDArray[np.float32], info: dict[str, Any]) -> None:
        for k, key in enumerate(self.info_keys):
            value = info.get(key, math.nan)
            try:
                out[k] = value
            except (TypeError, ValueError):
                raise EnvError(
                    f"env '{self.name}': info_keys holds '{key}', and the env's info['{key}'] is {value!r} "
                    f"({type(value).__name__}); info_keys takes numbers (or bools) only."
                ) from None

    def _snapshot_envs(self) -> list[Any]:
        return self.envs

    def close(self) -> None:
        for env in self.envs:
            env.close()
