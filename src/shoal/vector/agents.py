"""Serial backend for multi-agent envs: each env is an adapter over a fixed set of agent rows.

An adapter (``ParallelEnvAdapter`` for PettingZoo and dict-API envs, or a native ``AgentEnv``) is
bound to its env's rows of the flat-batch arrays and writes observations, rewards, flags and masks
straight into them; ``reset(seed)`` and ``step(actions)`` take and fill arrays, and autoreset
inside. After a step, its ``final_infos`` (slot -> info) hold the infos of the agents whose
episode ended; the backend takes them and empties the dict.
Like ``SerialBackend``, it is what each worker process of the multiprocessing backend runs over
its slice of shared memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy.typing as npt
import torch

from shoal.envs.spaces import ActionSpec, ObsSpec
from shoal.errors import EnvError, ShoalError
from shoal.vector.base import Buffers, Seed, StepBatch, VecBackend, env_seeds


class RowLayout(Protocol):
    """How an env's agents map onto its rows (``AgentLayout``, or a native env's ``NativeLayout``)."""

    @property
    def obs_space(self) -> gym.Space[Any]: ...
    @property
    def obs_spec(self) -> ObsSpec: ...
    @property
    def action_space(self) -> gym.Space[Any]: ...
    @property
    def act_spec(self) -> ActionSpec: ...
    @property
    def has_mask(self) -> bool: ...


class AgentAdapter(Protocol):
    """What this backend steps: an adapter (``ParallelEnvAdapter``, ``AECEnvAdapter``) over a
    multi-agent env, or a native ``AgentEnv``, which is its own."""

    @property
    def layout(self) -> RowLayout: ...
    @property
    def agents(self) -> list[str] | None: ...  # each slot's agent name; None: anonymous agents
    @property
    def num_agents(self) -> int: ...
    @property
    def state_size(self) -> int: ...  # width of the env's global state() it writes, 0: none
    @property
    def final_infos(self) -> dict[int, dict[str, Any]]: ...  # slot -> info, emptied by the backend
    @property
    def turn_based(self) -> bool: ...  # agents take turns (EnvInfo.turn_based)

    def bind(self, rows: dict[str, npt.NDArray[Any]]) -> None: ...
    def reset(self, seed: int | None) -> None: ...
    def step(self, actions: npt.NDArray[Any]) -> None: ...
    def close(self) -> None: ...


class AgentEnvBackend(VecBackend):
    autoreset = "same_step"
    unsaved_state = "multi-agent envs keep their state in objects shoal does not save"

    def __init__(
        self,
        make_env: Callable[[int], AgentAdapter],
        num_envs: int,
        name: str,
        buffers: Buffers | None = None,
        first_env_id: int = 0,
    ):
        self.envs = [make_env(first_env_id + i) for i in range(num_envs)]
        first = self.envs[0]
        layout = first.layout
        k = first.num_agents
        for i, env in enumerate(self.envs[1:], start=1):
            if (env.agents, env.num_agents, env.layout.obs_space, env.layout.action_space, env.turn_based) != (
                first.agents,
                k,
                layout.obs_space,
                layout.action_space,
                first.turn_based,
            ):
                turns = {True: ", taking turns", False: ""}
                raise EnvError(
                    f"env '{name}' copy {i} has {env.num_agents} agents {env.agents}{turns[env.turn_based]} with "
                    f"spaces {env.layout.obs_space} / {env.layout.action_space}, copy 0 has {k} agents "
                    f"{first.agents}{turns[first.turn_based]} with {layout.obs_space} / {layout.action_space}; all "
                    f"copies must match."
                )
        super().__init__(
            name,
            num_envs,
            layout.obs_spec,
            layout.act_spec,
            rows_per_env=k,
            buffers=buffers,
            first_env_id=first_env_id,
            mask_size=layout.act_spec.nvec[0] if layout.has_mask else 0,
            state_size=first.state_size,
            turn_based=first.turn_based,
        )
        self.agents = first.agents
        self.single_observation_space, self.single_action_space = layout.obs_space, layout.action_space
        for i, env in enumerate(self.envs):
            env.bind({key: buf[i * k : (i + 1) * k] for key, buf in self._buffers.items()})

    def reset(self, seed: Seed = None) -> None:
        seeds = env_seeds(seed, self.num_envs, self.first_env_id, self.name)
        if self.batch.env_done is not None:
            self.batch.env_done.zero_()
        for i, (env, s) in enumerate(zip(self.envs, seeds)):
            try:
                env.reset(s)
            except ShoalError:
                raise
            except Exception as e:
                raise self._failed(i, "reset", e) from e

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        self.step(self.env_actions(actions))

    def step(self, acts: npt.NDArray[Any]) -> None:
        """Step every env with its rows of ``acts``; final infos are keyed by row. ``env_done`` is
        cleared first, so an env only sets it on the step its game ends."""
        k, final_infos = self.rows_per_env, self.final_infos
        if final_infos:
            final_infos.clear()
        if self.batch.env_done is not None:
            self.batch.env_done.zero_()
        i = 0
        try:
            for i, env in enumerate(self.envs):
                env.step(acts[i * k : (i + 1) * k])
                if env.final_infos:
                    for slot, info in env.final_infos.items():
                        final_infos[i * k + slot] = info
                    env.final_infos.clear()
        except ShoalError:
            raise
        except Exception as e:
            raise self._failed(i, "step", e) from e

    def close(self) -> None:
        for env in self.envs:
            env.close()
