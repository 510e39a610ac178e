"""Native many-agent envs: one simulation of many agents in arrays, writing its rows of the flat batch.

The model is PufferLib's native envs and Metta's trainer: an env of, say, 128 agents steps
them all with numpy (or compiled code) and writes observations, rewards and flags straight into
its ``[num_agents, ...]`` rows of the ``[num_envs * num_agents, ...]`` batch, so no Python runs
per agent and nothing is copied. A subclass of ``AgentEnv`` declares ``num_agents``,
``single_observation_space`` (a Box; float ones are stored as float32), ``single_action_space``
(Discrete, MultiDiscrete or Box; every agent has the same spaces and they share one policy) and,
if it masks actions (Discrete only), ``action_masks = True``. It implements:

* ``reset(seed)``: start an episode; fill ``obs`` (and ``action_mask``) and clear
  ``terminated`` / ``truncated``.
* ``step(actions)``: ``actions`` is ``[num_agents, *action_shape]`` (int64, or float32 clipped
  to the Box). Fill ``reward``, ``terminated``, ``truncated`` and ``obs``. Agents whose episode
  ended are started again in the same step (their own, or the whole env's): ``obs`` holds the
  next episode's first observation and, for truncated rows, ``final_obs`` the true last one,
  which the learner bootstraps from. ``valid`` starts True; set rows False while agents are
  absent (dead, waiting), and every loss skips them. ``final_infos[slot] = info`` at an agent's
  episode end feeds custom metrics. An env whose agents take turns (``turn_based = True``) also
  sets ``env_done`` on the step its whole game ends.

The row arrays come from ``bind(rows)``, which the backend calls before ``reset``; under worker
processes they are shared memory. They are read-only attributes: replacing one instead of writing
into it would leave the batch stale, so it raises at once, in ``__init__``, ``reset`` or ``step``
alike, with no check run per step. The base class also supplies the rest of the adapter protocol
(``layout``, ``agents``, ``final_infos``, ``close``), so ``AgentEnvBackend`` and the worker
backend run a native env without an adapter.

Metrics: the agents are anonymous and interchangeable (``agents`` is None), so each agent's
episode counts as an episode, as PufferLib and Metta report them: ``episode_reward_mean`` is a
single agent's return. A team sum would grow with ``num_agents`` and needs every agent to end
its episode on the same step, which many-agent envs need not do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.envs.spaces import ActionSpec, ObsSpec, action_spec, obs_spec
from shoal.errors import EnvError


@dataclass(frozen=True)
class NativeLayout:
    """What the agent-env backend reads of an env's row layout (as from ``AgentLayout``)."""

    obs_space: gym.spaces.Box[Any]
    obs_spec: ObsSpec
    action_space: gym.Space[Any]
    act_spec: ActionSpec
    has_mask: bool


class _Unbound(dict[str, npt.NDArray[Any] | None]):
    """The rows of an env not bound yet: reading any of them says what is missing."""

    def __missing__(self, field: str) -> NoReturn:
        raise EnvError(
            f"this native env has no '{field}' rows yet: they come from bind(rows), which shoal's backend "
            f"calls before reset(); build the env's backend with make_backend or PPO(env=...)."
        )


def _rows_of(field: str) -> Any:
    """The property of ``field``'s rows. Typed ``Any`` (as ``dataclasses.field``) so that each class
    attribute it is assigned to declares the type of the rows it reads."""

    def get(self: AgentEnv) -> npt.NDArray[Any] | None:
        return self._rows[field]

    def replace(self: AgentEnv, value: Any) -> None:
        rows = self._rows.get(field)
        if value is rows and rows is not None:  # what an in-place `self.reward *= 2` assigns back
            return
        where = "" if rows is None else f" ({list(rows.shape)} {rows.dtype})"
        raise EnvError(
            f"env '{type(self).__name__}': self.{field} is this env's rows of the flat batch{where} and "
            f"cannot be replaced; write into it instead (self.{field}[:] = ...)."
        )

    return property(get, replace, doc=f"This env's rows of the batch's '{field}', to write in place.")


class AgentEnv:
    """Base class of native many-agent envs: one simulation of ``num_agents`` agents that writes
    its rows of the flat batch in place.

    Declare the class attributes below, implement ``reset`` and ``step``, and write into the row
    arrays (``obs``, ``reward``, ``terminated``, ``truncated``, ``valid``, ``final_obs``,
    ``action_mask``, ``env_done``), never replace them. ``shoal.PPO(env=MyEnv)`` or ``env="module:MyEnv"`` runs it.
    """

    num_agents: int
    """Agents in one env; each is a row of the flat batch."""
    single_observation_space: gym.spaces.Box[Any]
    """One agent's observation space (float Boxes are stored as float32)."""
    single_action_space: gym.Space[Any]
    """One agent's action space: Discrete, MultiDiscrete or Box, shared by all agents."""
    action_masks: bool = False
    """True when the env writes ``action_mask`` (Discrete actions only)."""
    agents: list[str] | None = None
    """None: anonymous agents, each agent's episode is an episode of its own."""
    state_size: int = 0
    """Width of a global state for a centralized critic; 0 for none (``team_obs`` works)."""
    turn_based: bool = False
    """True when agents take turns: the rows of agents still playing but not to move are not
    ``valid``, and a replay learner links each decision to its agent's next one. The env then
    says where a game ends in ``env_done``, since the flags cannot: an agent that leaves on its
    own move while the others wait looks from them alone like the end of the game. Without it, a
    game that an agent left early is never seen to end."""
    final_infos: dict[int, dict[str, Any]]
    """Slot -> info of an agent whose episode ended this step; feeds custom metrics."""

    _rows: dict[str, npt.NDArray[Any] | None] = _Unbound()
    obs: npt.NDArray[Any] = _rows_of("obs")  # in the observation space's dtype (float32 for float ones)
    reward: npt.NDArray[np.float32] = _rows_of("reward")
    terminated: npt.NDArray[np.bool_] = _rows_of("terminated")
    truncated: npt.NDArray[np.bool_] = _rows_of("truncated")
    valid: npt.NDArray[np.bool_] = _rows_of("valid")
    final_obs: npt.NDArray[Any] = _rows_of("final_obs")
    action_mask: npt.NDArray[np.bool_] | None = _rows_of("action_mask")  # None unless action_masks
    env_done: npt.NDArray[np.bool_] | None = _rows_of("env_done")  # None unless turn_based: set it on every
    # row at the step the whole game ended (and started again); the backend clears it before each step

    def reset(self, seed: int | None) -> None:
        """Start an episode: fill ``obs`` (and ``action_mask``), clear ``terminated`` and ``truncated``
        (the backend clears ``env_done`` before each step)."""
        raise NotImplementedError(f"native env '{type(self).__name__}' must implement reset(seed)")

    def step(self, actions: npt.NDArray[Any]) -> None:
        """Apply ``actions`` (``[num_agents, *action_shape]``) and fill ``reward``, ``terminated``,
        ``truncated`` and ``obs``; agents whose episode ended start again in the same step, with
        the true last observation of truncated ones in ``final_obs``."""
        raise NotImplementedError(f"native env '{type(self).__name__}' must implement step(actions)")

    def close(self) -> None:
        """Free what the env holds; the backend calls it once."""

    def bind(self, rows: dict[str, npt.NDArray[Any]]) -> None:
        """Write into ``rows`` (this env's slice of every flat-batch array) from now on."""
        self._rows = {"action_mask": None, "env_done": None, **rows}
        self.final_infos = {}

    @property
    def bound(self) -> bool:
        return not isinstance(self._rows, _Unbound)

    @cached_property
    def layout(self) -> NativeLayout:
        """The declared spaces as a row layout, checked once."""
        name = type(self).__name__
        for attr in ("num_agents", "single_observation_space", "single_action_space"):
            if not hasattr(self, attr):
                raise EnvError(
                    f"native env '{name}' does not set {attr}; set num_agents, single_observation_space "
                    f"and single_action_space in __init__."
                )
        n, obs, act = self.num_agents, self.single_observation_space, self.single_action_space
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise EnvError(f"native env '{name}' has num_agents={n!r}; it must be a positive int.")
        if not isinstance(obs, gym.spaces.Box):
            raise EnvError(
                f"native env '{name}' has single_observation_space {obs}; native envs write their "
                f"observations as arrays, so it must be a Box (of any shape and dtype)."
            )
        act_spec = action_spec(act)
        if self.action_masks and act_spec.kind != "discrete":
            raise EnvError(
                f"native env '{name}' sets action_masks=True with single_action_space {act}; action "
                f"masks need a Discrete action space."
            )
        return NativeLayout(obs, obs_spec(obs), act, act_spec, bool(self.action_masks))
