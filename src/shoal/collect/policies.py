"""Which policy acts for each agent row (seed 000/004's policy_mapping_fn), one forward per policy.

Every agent row belongs to one policy for a whole episode: ``policy_mapping_fn(agent_id,
episode)`` is called for each agent when its env starts an episode, so self-play can switch
opponents between episodes. Per step, each policy does one batched forward over the rows it
owns in the batch (index sets made once and kept until a mapping changes). With one policy there
is no mapping and no gather: the rows go straight through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoal.errors import ConfigError, did_you_mean

@dataclass(frozen=True)
class EpisodeStart:
    """What ``policy_mapping_fn`` gets as ``episode``: which env starts, and a running episode count."""

    env_id: int
    episode_id: int


def mapping_function(spec: Any, policy_ids: list[str], agents: list[str]) -> Callable[[str, EpisodeStart], str]:
    """``policy_mapping_fn`` as a function: a callable, ``'module:function'``, a dict {agent: policy},
    or None (the policy named like the agent, else the only policy)."""
    if spec is None:
        if all(a in policy_ids for a in agents):
            return lambda agent, episode: agent
        if len(policy_ids) == 1:
            return lambda agent, episode: policy_ids[0]
        raise ConfigError(f"policies {policy_ids} are not named like the agents {agents}; set policy_mapping_fn "
                          f"(a function of (agent_id, episode), 'module:function', or a dict {{agent: policy}}).")
    if isinstance(spec, dict):
        missing = [a for a in agents if a not in spec]
        if missing:
            raise ConfigError(f"policy_mapping_fn maps {sorted(spec)} but not the agents {missing} of this env.")
        return lambda agent, episode: spec[agent]
    if isinstance(spec, str):
        module, sep, name = spec.partition(":")
        try:
            spec = getattr(importlib.import_module(module), name) if sep else None
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"policy_mapping_fn '{spec}' cannot be imported ({e}).") from None
        if spec is None:
            raise ConfigError(f"policy_mapping_fn '{module}' must be 'package.module:function'.")
    if not callable(spec):
        raise ConfigError(f"policy_mapping_fn must be a function (agent_id, episode) -> policy id, got {spec!r}.")
    return spec


class PolicyMap:
    """The policies and the row -> policy assignment of one backend (env-major rows, ``k`` per env)."""

    def __init__(self, policies: dict[str, torch.nn.Module], mapping: Callable[[str, EpisodeStart], str] | None,
                 agents: list[str], num_envs: int):
        self.ids, self.modules = list(policies), list(policies.values())
        self.single = len(self.modules) == 1
        self.mapping, self.agents = mapping, agents
        self.row_policy = torch.zeros(num_envs * len(agents), dtype=torch.long)  # index into self.ids
        self.episodes_started = 0
        self._groups: dict[int, list[tuple[torch.nn.Module, torch.Tensor]]] = {}  # batch start row -> groups

    def start_episodes(self, envs: np.ndarray | range, first_env_id: int = 0) -> None:
        """Envs (backend indices) starting an episode: map each of their agents to a policy."""
        if self.single:
            return
        k = len(self.agents)
        before = self.row_policy.clone() if self._groups else None
        for env in envs:
            episode = EpisodeStart(first_env_id + int(env), self.episodes_started)
            self.episodes_started += 1
            for slot, agent in enumerate(self.agents):
                self.row_policy[int(env) * k + slot] = self._index(self.mapping(agent, episode), agent)
        if before is not None and not torch.equal(before, self.row_policy):
            self._groups.clear()

    def _index(self, policy_id: Any, agent: str) -> int:
        try:
            return self.ids.index(policy_id)
        except ValueError:
            raise ConfigError(f"policy_mapping_fn mapped agent '{agent}' to {policy_id!r}, which is not one of the "
                              f"policies {self.ids}.{did_you_mean(str(policy_id), self.ids)}") from None

    def _split(self, owner: torch.Tensor) -> list[tuple[torch.nn.Module, torch.Tensor]]:
        """Each policy among ``owner`` (policy indices of some rows) with the positions it owns."""
        return [(self.modules[p], (owner == p).nonzero().squeeze(1)) for p in owner.unique().tolist()]

    def _groups_for(self, rows: slice) -> list[tuple[torch.nn.Module, torch.Tensor]]:
        groups = self._groups.get(rows.start)
        if groups is None:
            groups = self._groups[rows.start] = self._split(self.row_policy[rows])
        return groups

    def act(self, obs: torch.Tensor, action_mask: torch.Tensor | None, rows: slice, deterministic: bool = False,
            out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, critic_obs: torch.Tensor | None = None):
        """``(action, log_prob, value)`` for the batch's rows, each row by its policy; also written
        into ``out`` when given."""
        if self.single:  # returns the policy's own (contiguous) tensors, which backends take fastest
            result = self.modules[0].act(obs, deterministic, action_mask, critic_obs)
            for dst, src in zip(out or (), result):
                dst.copy_(src)
            return result
        for module, idx in self._groups_for(rows):
            result = module.act(obs[idx], deterministic, None if action_mask is None else action_mask[idx],
                                None if critic_obs is None else critic_obs[idx])
            if out is None:
                out = tuple(torch.empty((len(obs), *r.shape[1:]), dtype=r.dtype) for r in result)
            for dst, src in zip(out, result):
                dst[idx] = src
        return out

    def value(self, obs: torch.Tensor, rows: slice, subset: torch.Tensor | None = None,
              critic_obs: torch.Tensor | None = None) -> torch.Tensor:
        """Values of the batch's rows (or of its rows ``subset``, whose obs ``obs`` holds)."""
        if self.single:
            return self.modules[0].value(obs, critic_obs)
        owner = self.row_policy[rows] if subset is None else self.row_policy[rows][subset]
        out = torch.empty(len(obs))
        for module, idx in self._split(owner):
            out[idx] = module.value(obs[idx], None if critic_obs is None else critic_obs[idx])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"row_policy": self.row_policy.tolist(), "episodes_started": self.episodes_started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.row_policy[:] = torch.tensor(state["row_policy"])
        self.episodes_started = state["episodes_started"]
        self._groups.clear()
