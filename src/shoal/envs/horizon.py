"""Episode horizons, applied to each env where it is made (so serial, worker-process and Ray
backends, and evaluation, all see the same episodes).

``horizon=H`` ends an episode after H steps as a truncation: the learner bootstraps from the
value of the last observation, as for any time limit. ``soft_horizon`` cuts the episode at H for
the metrics and the bootstrap but does not reset the env: the backend's reset after the cut gets
the observation the env is at, and the task continues (continuing tasks without natural ends).
``no_done_at_end`` turns the env's own terminations into truncations, for envs that signal time
limits as terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from shoal.errors import ConfigError


@dataclass(frozen=True)
class EpisodeRules:
    horizon: int | None = None
    soft_horizon: bool = False
    no_done_at_end: bool = False

    @property
    def active(self) -> bool:
        """Whether the rules change any episode (``soft_horizon`` alone needs a horizon)."""
        return self.horizon is not None or self.no_done_at_end


class HorizonWrapper(gym.Wrapper[Any, Any, Any, Any]):
    """A single-agent env under ``EpisodeRules`` (see the module docstring)."""

    def __init__(self, env: gym.Env[Any, Any], rules: EpisodeRules):
        super().__init__(env)
        self.rules = rules  # configuration: env snapshots leave it out, so a resume takes the new config's
        self.episode_steps = 0
        self.carried_obs: Any = None  # set at a soft cut: what the next reset() hands back

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_steps += 1
        rules = self.rules
        if terminated and rules.no_done_at_end:
            terminated, truncated = False, True
        if rules.horizon is not None and self.episode_steps >= rules.horizon and not (terminated or truncated):
            truncated = True
            if rules.soft_horizon:
                self.carried_obs = obs
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.episode_steps = 0
        carried, self.carried_obs = self.carried_obs, None
        if carried is not None and seed is None and options is None:  # a soft cut: the env goes on
            return carried, {}
        return self.env.reset(seed=seed, options=options)


class ParallelHorizonWrapper:
    """A PettingZoo ParallelEnv under ``EpisodeRules`` (hard horizons only): at H every agent
    still acting is truncated and ``agents`` reads empty until the next reset, as after any
    episode end. Everything else is the env's own."""

    def __init__(self, env: Any, rules: EpisodeRules):
        if rules.soft_horizon:
            raise ConfigError(
                "soft_horizon=True needs a single-agent env: a PettingZoo env removes its agents at the "
                "cut and cannot go on without a reset; use horizon=H alone."
            )
        self.env, self.rules, self.episode_steps, self.cut = env, rules, 0, False

    @property
    def agents(self) -> list[str]:
        return [] if self.cut else list(self.env.agents)

    def __getattr__(self, name: str) -> Any:
        if name == "env" or name.startswith("__"):  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.episode_steps, self.cut = 0, False
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        still_in = list(self.env.agents)  # before the step: agents sitting it out end at a cut too
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        terminations, truncations = dict(terminations), dict(truncations)  # not the env's own dicts
        self.episode_steps += 1
        if self.rules.no_done_at_end:
            for agent, ended in terminations.items():
                if ended:
                    terminations[agent], truncations[agent] = False, True
        if self.rules.horizon is not None and self.episode_steps >= self.rules.horizon:
            for agent in {*obs, *still_in}:
                if not terminations.get(agent, False):
                    truncations[agent] = True
            self.cut = True
        return obs, rewards, terminations, truncations, infos


def stepped_as_one_vector(what: str) -> ConfigError:
    """The refusal of horizons for envs stepped as one vector (``what`` says which)."""
    return ConfigError(
        f"horizon / no_done_at_end wrap each env shoal makes; with {what} the envs are stepped as one "
        f"vector (a VMAS scenario, a VectorEnv or vectorization_mode), so set the step limit in the env itself."
    )


def with_rules(env: Any, rules: EpisodeRules, name: str) -> Any:
    """``env`` under ``rules``: gym envs and PettingZoo ParallelEnvs; other kinds are refused."""
    from shoal.envs.multi_agent import is_dict_env
    from shoal.envs.registry import is_aec_env, is_parallel_env

    if is_dict_env(env) or is_aec_env(env) or not (isinstance(env, gym.Env) or is_parallel_env(env)):
        raise ConfigError(
            f"horizon / no_done_at_end apply to Gymnasium envs and PettingZoo ParallelEnvs; '{name}' is a "
            f"{type(env).__name__}. End its episodes in the env itself (a step limit in env_config), or "
            f"wrap it in a ParallelEnv."
        )
    return HorizonWrapper(env, rules) if isinstance(env, gym.Env) else ParallelHorizonWrapper(env, rules)


def declared_episode_steps(env: Any, env_config: dict[str, Any]) -> int | None:
    """The step limit of ``env``'s episodes when it declares one, without making the env: the
    limit in ``env_config`` (``gym.make``'s ``max_episode_steps``, PettingZoo's ``max_cycles``,
    VMAS's ``max_steps``), else that of the spec of a registered Gymnasium id or of an env
    instance; None otherwise."""
    limit = next((env_config[k] for k in ("max_episode_steps", "max_cycles", "max_steps") if k in env_config), None)
    if limit is None:
        if isinstance(env, str):
            spec = gym.registry.get(env) or gym.registry.get(env.partition(":")[2])
        else:
            spec = getattr(env, "spec", None)
        limit = getattr(spec, "max_episode_steps", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
