"""PettingZoo Parallel envs as agent rows of the flat batch: one row per possible agent.

Agents absent from a step (not yet spawned, or gone after terminating mid-episode) are padding
rows: their ``valid`` is False, so every loss skips them. The episode ends for the env when no
agent is left; the env is then reset at once (``same_step`` autoreset) and truncated agents keep
their true last observation in ``final_obs``.

Agents with different spaces share one row layout: flat Box observations are zero-padded to the
widest, and Discrete actions of different sizes become one Discrete(max n) whose extra actions are
masked out. An env's own action masks (observations of the form
``{"observation": ..., "action_mask": ...}``, as in PettingZoo's classic games) fill the
``action_mask`` rows.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from shoal.envs.spaces import ObsSpec, action_spec, obs_spec
from shoal.errors import EnvError

MASK_KEYS = {"observation", "action_mask"}


def _split_mask_space(space: gym.Space[Any]) -> tuple[gym.Space[Any], bool]:
    """The observation part of a space, and whether the env sends an action mask alongside it."""
    if isinstance(space, gym.spaces.Dict) and set(space.spaces) == MASK_KEYS:
        return space["observation"], True
    return space, False


class AgentLayout:
    """How each agent's observations and actions map onto the shared row layout."""

    def __init__(
        self, name: str, agents: list[str], obs_spaces: list[gym.Space[Any]], act_spaces: list[gym.Space[Any]]
    ):
        self.name = name
        split = [_split_mask_space(s) for s in obs_spaces]
        self.env_masks = any(m for _, m in split)
        self.obs = [obs_spec(s) for s, _ in split]
        self.obs_space: gym.Space[Any]
        if len({o.shape for o in self.obs}) == 1:
            self.obs_space = split[0][0]
        elif all(len(o.shape) == 1 for o in self.obs):
            width = max(o.shape[0] for o in self.obs)
            self.obs_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)
        else:
            shapes = ", ".join(f"{a}: {o.shape}" for a, o in zip(agents, self.obs))
            raise EnvError(
                f"env '{name}': agents' observations differ in shape ({shapes}); shoal pads flat "
                f"observations of different sizes but cannot pad multi-dimensional ones."
            )
        self.obs_spec = obs_spec(self.obs_space)
        self.action_space, self.action_n = self._action_layout(agents, act_spaces)
        self.act_spec = action_spec(self.action_space)
        self.has_mask = self.env_masks or len(set(self.action_n)) > 1

    def _action_layout(self, agents: list[str], spaces: list[gym.Space[Any]]) -> tuple[gym.Space[Any], list[int]]:
        discrete = [s for s in spaces if isinstance(s, gym.spaces.Discrete)]
        if len(discrete) == len(spaces):
            sizes = [int(s.n) for s in discrete]
            return gym.spaces.Discrete(max(sizes)), sizes
        if all(s == spaces[0] for s in spaces):
            return spaces[0], [0] * len(spaces)
        listed = ", ".join(f"{a}: {s}" for a, s in zip(agents, spaces))
        raise EnvError(
            f"env '{self.name}': agents' action spaces differ ({listed}); shoal lays out Discrete spaces "
            f"of different sizes in one row layout, other spaces must be equal for every agent."
        )

    def write_obs(self, slot: int, out: npt.NDArray[Any], obs: Any, mask_out: npt.NDArray[np.bool_] | None) -> None:
        """Write agent ``slot``'s observation into its row ``out``, and the action mask the env sent
        with it into ``mask_out`` (None: not wanted)."""
        if self.env_masks:
            if not isinstance(obs, dict) or not set(obs) >= MASK_KEYS:
                got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
                raise EnvError(f"env '{self.name}' promised observations with keys {sorted(MASK_KEYS)}, got {got}.")
            if mask_out is not None:
                mask_out[:] = np.asarray(obs["action_mask"], dtype=bool)
            obs = obs["observation"]
        spec: ObsSpec = self.obs[slot]
        if spec.shape == self.obs_spec.shape:
            spec.write(out, obs, self.name)
        else:
            size = spec.shape[0]
            spec.write(out[:size], obs, self.name)
            out[size:] = 0


def _state_size(env: Any, name: str) -> int:
    space = getattr(env, "state_space", None)
    if space is None or not callable(getattr(env, "state", None)):
        raise EnvError(
            f"central_critic='state' needs the env's global state, but '{name}' has no state_space and "
            f"state(); use central_critic='team_obs' (every agent's observation) instead."
        )
    return int(np.prod(space.shape))


class ParallelEnvAdapter:
    """Steps one PettingZoo ParallelEnv with arrays, writing into the rows it is bound to."""

    def __init__(self, env: Any, name: str, env_state: bool = False):
        """``env_state``: also write the env's global ``state()`` on its rows (for a centralized critic)."""
        self.env, self.name = env, name
        self.turn_based = bool(getattr(env, "turn_based", False))  # a dict-API env that says its agents take turns
        self.state_size = _state_size(env, name) if env_state else 0
        self.agents = list(env.possible_agents)
        if not self.agents:
            raise EnvError(f"env '{name}' has no possible_agents.")
        self.slot = {agent: i for i, agent in enumerate(self.agents)}
        self.layout = AgentLayout(
            name,
            self.agents,
            [env.observation_space(a) for a in self.agents],
            [env.action_space(a) for a in self.agents],
        )
        self.discrete = self.layout.act_spec.kind == "discrete"
        self.final_infos: dict[int, dict[str, Any]] = {}

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def bind(self, rows: dict[str, npt.NDArray[Any]]) -> None:
        """Use ``rows`` (this env's slice of every flat-batch array) as the output."""
        self.out = rows
        self.mask = rows.get("action_mask")
        self.env_done = rows.get("env_done")  # bound when the env takes turns
        if self.mask is not None:  # agents whose Discrete is smaller than the layout's never see the extra actions
            self._size_mask = np.arange(self.mask.shape[1]) < np.asarray(self.layout.action_n)[:, None]

    def _write_state(self, key: str) -> None:
        """The env's global state on every row of ``out[key]`` (``state``, or ``final_state`` before a reset)."""
        if self.state_size:
            self.out[key][:] = np.asarray(self.env.state(), dtype=np.float32).reshape(-1)

    def _write_all(self, observations: dict[str, Any]) -> None:
        """Rows of present agents get their observation (and the env state); absent agents' rows
        are zeroed padding."""
        self._write_state("state")
        out, mask = self.out, self.mask
        out["obs"][:] = 0
        if mask is not None:
            mask[:] = self._size_mask
        for agent, obs in observations.items():
            slot = self._slot_of(agent)
            mask_row = None if mask is None else mask[slot]
            self.layout.write_obs(slot, out["obs"][slot], obs, mask_row)
            if mask_row is not None:
                mask_row &= self._size_mask[slot]

    def _slot_of(self, agent: str) -> int:
        try:
            return self.slot[agent]
        except KeyError:
            raise EnvError(
                f"env '{self.name}' returned agent '{agent}', which is not in its possible_agents {self.agents}."
            ) from None

    def reset(self, seed: int | None) -> None:
        observations, _ = self.env.reset(seed=seed)
        self._write_all(observations)
        self.alive = np.zeros(self.num_agents, dtype=bool)  # agents in the episode, who act next step
        self.alive[[self._slot_of(a) for a in observations]] = True
        self.out["terminated"][:] = False
        self.out["truncated"][:] = False
        self.out["valid"][:] = True

    def _game_over(self) -> None:
        """Mark every row's ``env_done`` (where the rows have one): the whole game ended this step.
        The backend clears the field before each step and reset, so only the end is written."""
        if self.env_done is not None:
            self.env_done[:] = True

    def step(self, actions: npt.NDArray[Any]) -> None:
        """One parallel step of the agents present. ``valid`` marks the rows that acted, and a
        row's done flag is set on the step its agent leaves, also when it sat this step out (its
        last decision then ends there). With no agent left the episode is over and the env is
        reset at once."""
        out, convert = self.out, int if self.discrete else np.asarray
        acting = np.flatnonzero(self.alive)
        in_episode = [self._slot_of(a) for a in self.env.agents]
        observations, rewards, terminations, truncations, infos = self.env.step(
            {self.agents[i]: convert(actions[i]) for i in acting}
        )
        out["valid"][:] = self.alive
        out["reward"][:] = 0.0
        out["terminated"][:] = False
        out["truncated"][:] = False
        for agent, r in rewards.items():
            out["reward"][self._slot_of(agent)] = r
        for i in in_episode:
            agent = self.agents[i]
            te = bool(terminations.get(agent, False))
            tr = bool(truncations.get(agent, False)) and not te
            if te or tr:
                out["terminated"][i], out["truncated"][i] = te, tr
                if infos.get(agent):
                    self.final_infos[i] = infos[agent]
                if tr and agent in observations:
                    self.layout.write_obs(i, out["final_obs"][i], observations[agent], None)
        if not self.env.agents:
            self._game_over()
            self._write_state("final_state")
            observations, _ = self.env.reset()
        present = [a for a in self.env.agents if a in observations]
        self._write_all({a: observations[a] for a in present})
        self.alive[:] = False
        self.alive[[self._slot_of(a) for a in present]] = True

    def close(self) -> None:
        self.env.close()
