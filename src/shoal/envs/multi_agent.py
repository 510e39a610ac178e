"""Multi-agent envs in RLlib's dict API (its new API stack), stepped by the PettingZoo adapter.

Such an env talks in dicts keyed by agent id: ``reset()`` returns the observations of the
agents that act first, ``step(action_dict)`` those of the agents that act next (an agent may sit
out steps, e.g. while it is not its turn) with per-agent rewards, flags and infos, and
``terminateds["__all__"]`` / ``truncateds["__all__"]`` end the episode for every agent.

That is PettingZoo's Parallel API but for two things, which ``ParallelView`` bridges so that
``ParallelEnvAdapter`` does all the row work for both APIs: the episode ends on one flag for
everyone (Parallel: when no agent is left), and the env need not keep the list of agents still in
the episode (Parallel: ``env.agents``). An agent is in the episode from its first observation
until its own done flag or ``"__all__"``; an agent that shows up again after its done starts a
new episode of its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from shoal.envs.pettingzoo import ParallelEnvAdapter
from shoal.errors import EnvError

ALL = "__all__"


def space_of(env: Any, kind: str, agent: Any) -> gym.Space[Any]:
    """``env.<kind>_spaces[agent]`` (kind: "observation" or "action"), or a clear error."""
    spaces = getattr(env, f"{kind}_spaces", None)
    if not isinstance(spaces, Mapping) or agent not in spaces:
        have = sorted(map(str, spaces)) if isinstance(spaces, Mapping) else spaces
        raise EnvError(
            f"env '{type(env).__name__}' has no {kind} space for agent '{agent}': set self.{kind}_spaces "
            f"to a dict with a space for every agent in possible_agents, or override "
            f"get_{kind}_space (its {kind}_spaces: {have})."
        )
    space: gym.Space[Any] = spaces[agent]
    return space


class MultiAgentEnv(gym.Env):
    """Base class for multi-agent envs in RLlib's dict API.

    In ``__init__`` set ``possible_agents`` (every agent id the env may use), ``agents`` (those
    in the current episode; shoal does not read it) and the ``observation_spaces`` /
    ``action_spaces`` dicts (or override ``get_observation_space`` / ``get_action_space``).
    Implement ``reset(*, seed=None, options=None) -> (obs, infos)`` and
    ``step(action_dict) -> (obs, rewards, terminateds, truncateds, infos)``, all dicts keyed by
    agent id, where ``terminateds`` and ``truncateds`` also carry ``"__all__"``. Only agents with
    an observation act on the next step.
    """

    observation_spaces: dict[Any, gym.Space[Any]] | None = None
    action_spaces: dict[Any, gym.Space[Any]] | None = None
    turn_based: bool = False
    """True when agents take turns (one or a few act at each step while the others wait in the
    episode): a replay learner then links each agent's decision to its next one and folds the
    rewards that arrive while it waits into it."""

    def get_observation_space(self, agent: Any) -> gym.Space[Any]:
        return space_of(self, "observation", agent)

    def get_action_space(self, agent: Any) -> gym.Space[Any]:
        return space_of(self, "action", agent)


def is_dict_env(env: Any) -> bool:
    """A dict-API env: a shoal ``MultiAgentEnv``, or a gym.Env shaped like one (RLlib's own class)."""
    return isinstance(env, MultiAgentEnv) or (
        isinstance(env, gym.Env) and hasattr(env, "possible_agents") and hasattr(env, "observation_spaces")
    )


def dict_env_adapter(env: Any, name: str) -> ParallelEnvAdapter:
    """The adapter that writes a dict-API env's agents into their rows."""
    return ParallelEnvAdapter(ParallelView(env, name), name)


class ParallelView:
    """A dict-API env seen through the part of PettingZoo's Parallel API the adapter uses."""

    def __init__(self, env: Any, name: str):
        self.env, self.name = env, name
        agents = getattr(env, "possible_agents", None)
        if not agents:
            raise EnvError(
                f"env '{name}' has possible_agents={agents!r}; a multi-agent env lists every agent id "
                f"it may use in self.possible_agents."
            )
        self.possible_agents = list(agents)
        self.turn_based = bool(getattr(env, "turn_based", False))
        self._known = frozenset(self.possible_agents) | {ALL}
        self.agents: list[Any] = []  # in the episode: observed since the reset and not done since

    def observation_space(self, agent: Any) -> gym.Space[Any]:
        return self._space("observation", agent)

    def action_space(self, agent: Any) -> gym.Space[Any]:
        return self._space("action", agent)

    def _space(self, kind: str, agent: Any) -> gym.Space[Any]:
        getter = getattr(self.env, f"get_{kind}_space", None)  # RLlib's envs may compute spaces there
        space: gym.Space[Any] = getter(agent) if getter is not None else space_of(self.env, kind, agent)
        return space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[Any, Any], dict[Any, Any]]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._check_dict("reset", "observations", obs)
        self.agents = list(obs)
        return obs, infos

    def step(
        self, actions: dict[Any, Any]
    ) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
        obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
        self._check_dict("step", "observations", obs)
        self._check_dict("step", "rewards", rewards)
        for flags, what in ((terminateds, "terminateds"), (truncateds, "truncateds")):
            self._check_dict("step", what, flags)
            if ALL not in flags:
                raise EnvError(
                    f"env '{self.name}' step() returned {what} without the key '{ALL}' (keys: "
                    f"{sorted(map(str, flags))}); the dict API needs it: True ends the episode for every "
                    f"agent."
                )
            unknown = flags.keys() - self._known
            if unknown:
                raise EnvError(
                    f"env '{self.name}' step() returned {what} for agent(s) {sorted(map(str, unknown))}, "
                    f"which are not in its possible_agents {self.possible_agents}."
                )
        if terminateds[ALL] or truncateds[ALL]:
            # Everyone in the episode is done now, those sitting out this step included: their
            # rows' last decisions must not bootstrap into the next episode.
            end_te, end_tr = bool(terminateds[ALL]), bool(truncateds[ALL])
            terminateds = {a: end_te or bool(terminateds.get(a, False)) for a in self.agents}
            truncateds = {a: end_tr or bool(truncateds.get(a, False)) for a in self.agents}
            self.agents = []
        else:
            done = {a for flags in (terminateds, truncateds) for a, d in flags.items() if d}
            staying = [a for a in self.agents if a not in done]
            joined = obs.keys() - done - set(staying)
            self.agents = staying + [a for a in obs if a in joined]
        return obs, rewards, terminateds, truncateds, infos

    def _check_dict(self, method: str, what: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise EnvError(
                f"env '{self.name}' {method}() returned {what} of type {type(value).__name__}; the "
                f"dict API returns a dict keyed by agent id."
            )

    def close(self) -> None:
        self.env.close()
