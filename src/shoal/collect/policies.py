"""Which policy acts for each agent row (RLlib's policy_mapping_fn), one forward per policy.

Every agent row belongs to one policy for a whole episode: ``policy_mapping_fn(agent_id,
episode)`` is called for each agent when its env starts an episode, so self-play can switch
opponents between episodes. Per step, each policy does one batched forward over the rows it
owns in the batch (index sets made once and kept until a mapping changes). With one policy there
is no mapping and no gather: the rows go straight through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal.errors import ConfigError, did_you_mean
from shoal.imports import import_spec
from shoal.models.policy import Policy


@dataclass(frozen=True)
class EpisodeStart:
    """What ``policy_mapping_fn(agent_id, episode)`` gets as ``episode``."""

    env_id: int
    """The env whose episode starts."""
    episode_id: int
    """A running count of the episodes started in all envs, e.g. to alternate sides in self-play."""


MappingFn = Callable[[str, EpisodeStart], str]  # (agent id, episode) -> policy id


def mapping_function(spec: Any, policy_ids: list[str], agents: list[str]) -> MappingFn:
    """``policy_mapping_fn`` as a function: a callable, ``'module:function'``, a dict {agent: policy},
    or None (the policy named like the agent, else the only policy)."""
    if spec is None:
        if all(a in policy_ids for a in agents):
            return lambda agent, episode: agent
        if len(policy_ids) == 1:
            return lambda agent, episode: policy_ids[0]
        raise ConfigError(
            f"policies {policy_ids} are not named like the agents {agents}; set policy_mapping_fn "
            f"(a function of (agent_id, episode), 'module:function', or a dict {{agent: policy}})."
        )
    if isinstance(spec, dict):
        missing = [a for a in agents if a not in spec]
        if missing:
            raise ConfigError(f"policy_mapping_fn maps {sorted(spec)} but not the agents {missing} of this env.")
        return lambda agent, episode: spec[agent]
    if isinstance(spec, str):
        spec = import_spec(spec, "policy_mapping_fn")
    if not callable(spec):
        raise ConfigError(f"policy_mapping_fn must be a function (agent_id, episode) -> policy id, got {spec!r}.")
    mapping: MappingFn = spec  # the user's function; PolicyMap checks each id it returns
    return mapping


class PolicyMap:
    """The policies, the row -> policy assignment and the per-row policy state of one backend
    (env-major rows, ``k`` per env)."""

    def __init__(
        self,
        policies: dict[str, Policy],
        mapping: MappingFn | None,
        agents: list[str],
        num_envs: int,
    ):
        """``mapping`` is None only with a single policy, which acts for every row."""
        self.ids, self.modules = list(policies), list(policies.values())
        self.single = len(self.modules) == 1
        self.mapping, self.agents = mapping, agents
        num_rows = num_envs * len(agents)
        self.row_policy = torch.zeros(num_rows, dtype=torch.long)  # index into self.ids
        self.episodes_started = 0
        # each policy's state of every row (read only on the rows it owns); empty for feedforward policies
        self.states = [module.initial_state(num_rows) for module in self.modules]
        # tensordict's TensorDict.is_empty overrides the annotated TensorDictBase.is_empty without annotations
        self.stateful = any(not state.is_empty() for state in self.states)  # type: ignore[no-untyped-call]
        # the policies whose core reads the previous reward, which the collector gives them after each step
        self.reward_fed = [p for p, state in enumerate(self.states) if "prev_reward" in state.keys()]  # noqa: SIM118
        self._groups: dict[int, list[tuple[int, torch.Tensor]]] = {}  # batch start row -> (policy, positions)
        self._state_views: dict[tuple[int, int], TensorDict] = {}  # (policy, batch start row) -> its rows

    def start_episodes(self, envs: npt.NDArray[np.int64] | range, first_env_id: int = 0) -> None:
        """Envs (backend indices) starting an episode: map each of their agents to a policy."""
        if self.single:
            return
        mapping = cast(MappingFn, self.mapping)  # set whenever there are several policies
        k = len(self.agents)
        before = self.row_policy.clone() if self._groups else None
        for env in envs:
            episode = EpisodeStart(first_env_id + int(env), self.episodes_started)
            self.episodes_started += 1
            for slot, agent in enumerate(self.agents):
                self.row_policy[int(env) * k + slot] = self._index(mapping(agent, episode), agent)
        if before is not None and not torch.equal(before, self.row_policy):
            self._groups.clear()

    def _index(self, policy_id: Any, agent: str) -> int:
        try:
            return self.ids.index(policy_id)
        except ValueError:
            raise ConfigError(
                f"policy_mapping_fn mapped agent '{agent}' to {policy_id!r}, which is not one of the "
                f"policies {self.ids}.{did_you_mean(str(policy_id), self.ids)}"
            ) from None

    def split(self, owner: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """Each policy among ``owner`` (policy indices of some rows) with the positions it owns."""
        return [(p, (owner == p).nonzero().squeeze(1)) for p in torch.unique(owner).tolist()]

    def _groups_for(self, rows: slice) -> list[tuple[int, torch.Tensor]]:
        groups = self._groups.get(rows.start)
        if groups is None:
            groups = self._groups[rows.start] = self.split(self.row_policy[rows])
        return groups

    def state(self, p: int, rows: slice) -> TensorDict:
        """Policy ``p``'s state of the batch's ``rows`` (a view, made once)."""
        view = self._state_views.get((p, rows.start))
        if view is None:
            view = self._state_views[(p, rows.start)] = self.states[p][rows]
        return view

    def feed_rewards(self, reward: torch.Tensor, rows: slice) -> None:
        """The step's ``reward`` of ``rows`` becomes the previous reward their cores read next."""
        for p in self.reward_fed:
            self.state(p, rows)["prev_reward"].copy_(reward.unsqueeze(1))

    def check_extras(self, extras: tuple[str, ...]) -> None:
        """Every policy's ``act`` gives the per-step fields ``extras`` the algorithm stores."""
        for pid, module in zip(self.ids, self.modules):
            missing = [key for key in extras if key not in module.extras]
            if missing:
                raise ConfigError(
                    f"policy '{pid}' ({type(module).__name__}) does not give the per-step fields {missing} "
                    f"the algorithm stores; its act() fills {list(module.extras)}."
                )

    def act(
        self,
        obs: torch.Tensor,
        first: torch.Tensor,
        action_mask: torch.Tensor | None,
        rows: slice,
        *,
        deterministic: bool = False,
        out: TensorDict | None = None,
        critic_obs: torch.Tensor | None = None,
        advance: bool = True,
    ) -> tuple[torch.Tensor, TensorDict]:
        """Actions and extras for the batch's ``rows``, each row by its policy (extras written into
        ``out`` when given). ``advance=False`` leaves the policy state as it was (acting on an
        observation that will be acted on again)."""
        if self.single:  # returns the policy's own (contiguous) action tensor, which backends take fastest
            state = self.state(0, rows)
            action, extras, next_state = self.modules[0].act(
                obs, state, first, action_mask, deterministic=deterministic, out=out, critic_obs=critic_obs
            )
            if self.stateful and advance and next_state is not state:  # a policy may update its rows in place
                state.update_(next_state)
            return action, extras
        actions: torch.Tensor | None = None
        for p, idx in self._groups_for(rows):
            state = self.state(p, rows)
            part = state[idx]
            a, extras, next_state = self.modules[p].act(
                obs[idx],
                part,
                first[idx],
                None if action_mask is None else action_mask[idx],
                deterministic=deterministic,
                critic_obs=None if critic_obs is None else critic_obs[idx],
            )
            if actions is None:  # the first policy: allocate for every row
                actions = a.new_empty((len(obs), *a.shape[1:]))
            if out is None:
                empty = {k: cast(torch.Tensor, v).new_empty((len(obs), *v.shape[1:])) for k, v in extras.items()}
                out = TensorDict(empty, batch_size=[len(obs)])  # extras are flat: one tensor each
            actions[idx] = a
            for key, stored in out.items():  # what the algorithm stores, a subset of the extras
                stored[idx] = extras.get(key)
            if self.stateful and advance:
                state[idx] = next_state
        return cast(torch.Tensor, actions), cast(TensorDict, out)  # set: every row has a policy

    def state_dict(self) -> dict[str, Any]:
        return {
            "row_policy": self.row_policy.tolist(),
            "episodes_started": self.episodes_started,
            "states": [state.to_dict() for state in self.states],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.row_policy[:] = torch.tensor(state["row_policy"])
        self.episodes_started = state["episodes_started"]
        for mine, saved in zip(self.states, state["states"]):
            mine.update_(saved)
        self._groups.clear()
