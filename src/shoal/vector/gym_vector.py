"""Backend over a Gymnasium VectorEnv (sync, async, or natively vectorized ``vector_entry_point``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from gymnasium.vector import AutoresetMode

from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import ConfigError, EnvError
from shoal.vector.base import Buffers, Seed, StepBatch, VecBackend, env_seeds


class GymVectorBackend(VecBackend):
    def __init__(self, venv: gym.vector.VectorEnv[Any, Any, Any], name: str):
        if not isinstance(venv.single_observation_space, gym.spaces.Box):
            raise EnvError(
                f"vector env '{name}' has observation space {venv.single_observation_space}; vector envs must "
                f"have Box observations (wrap the single env in gymnasium.wrappers.FlattenObservation)."
            )
        mode = venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise EnvError(f"vector env '{name}' uses autoreset_mode={mode}; shoal needs NEXT_STEP or SAME_STEP.")
        self.autoreset = "next_step" if mode == AutoresetMode.NEXT_STEP else "same_step"
        super().__init__(
            name, venv.num_envs, obs_spec(venv.single_observation_space), action_spec(venv.single_action_space)
        )
        self.venv = venv
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self._prev_done = np.zeros(self.num_envs, dtype=bool)

    def _write(self, field: str, buf: npt.NDArray[Any], value: Any) -> None:
        value = np.asarray(value)
        if value.shape != buf.shape:
            raise EnvError(
                f"vector env '{self.name}' returned {field} of shape {value.shape} and dtype {value.dtype}; "
                f"expected shape {buf.shape} (num_envs={self.num_envs}) and dtype {buf.dtype}."
            )
        buf[...] = value

    def reset(self, seed: Seed = None) -> None:
        """An int or None goes to the vector env as it is; a list of one seed per env too (sync and
        async vector envs reset env i with seeds[i]; natively vectorized ones, with one random
        stream for all their envs, refuse it)."""
        if seed is None or isinstance(seed, int):
            obs, _ = self.venv.reset(seed=seed)
            if seed is not None:
                self.venv.action_space.seed(seed)
        else:
            seeds = env_seeds(seed, self.num_envs, 0, self.name)
            try:
                obs, _ = self.venv.reset(seed=seeds)  # type: ignore[arg-type]  # sync / async take a list; the stub says int
            except (gym.error.Error, TypeError, ValueError) as e:
                raise ConfigError(
                    f"vector env '{self.name}' ({type(self.venv).__name__}) cannot reset each env with its "
                    f"own seed ({e}); per-env seeds need envs made one by one (leave vectorization_mode "
                    f"unset, or use 'sync' / 'async')."
                ) from None
            self.venv.action_space.seed(seeds[0])  # a batched space takes one int
        self._write("observations", self._obs, obs)
        self._prev_done[:] = False
        self._valid[:] = True

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        obs, rew, term, trunc, info = self.venv.step(self.env_actions(actions))
        self._write("observations", self._obs, obs)
        self._write("rewards", self._reward, rew)
        self._write("terminations", self._terminated, term)
        self._write("truncations", self._truncated, trunc)
        if self.final_infos:
            self.final_infos.clear()
        if info and (self._terminated.any() or self._truncated.any()):
            self._keep_final_infos(info.get("final_info", info))
        if self.autoreset == "next_step":
            np.logical_not(self._prev_done, out=self._valid)
            np.logical_or(self._terminated, self._truncated, out=self._prev_done)
        elif self._truncated.any():
            rows = np.flatnonzero(info["_final_obs"] & self._truncated)
            for i in rows:
                self._final_obs[i] = info["final_obs"][i]

    def _keep_final_infos(self, info: dict[str, Any]) -> None:
        """Vector infos are dicts of per-env arrays with ``_key`` masks; split out the done rows."""
        arrays = [
            (k, v, info.get(f"_{k}")) for k, v in info.items() if not k.startswith("_") and isinstance(v, np.ndarray)
        ]
        for i in np.flatnonzero(self._terminated | self._truncated).tolist():
            row = {k: v[i] for k, v, present in arrays if present is None or present[i]}
            if row:
                self.final_infos[i] = row

    def _snapshot_envs(self) -> list[Any]:
        return [self.venv]

    def _snapshot_buffers(self) -> Buffers:
        return {**super()._snapshot_buffers(), "prev_done": self._prev_done}

    def close(self) -> None:
        self.venv.close()
