"""VMAS backend: one torch-vectorized VMAS environment shown as a flat agent batch.

VMAS steps ``num_envs`` copies of a multi-agent scenario as batched torch tensors, so there is
no numpy round trip: actions go in as per-agent views of one action buffer and per-agent
observations and rewards come back as ``[N, ...]`` tensors that are stacked straight into the
flat buffers. Rows are env-major: row ``env * n_agents + agent``.

Episode ends: the env is built with ``terminated_truncated=True``, so VMAS reports the
scenario's own ``done()`` as ``terminated`` and ``steps >= max_steps`` as ``truncated`` (both
may be set; then no bootstrap, as in Gymnasium). Every agent of an env shares its flags.
Without ``max_steps`` in ``env_config`` episodes end only when the scenario says so.

Autoreset is ``same_step``: VMAS does not reset by itself and 1.5 can reset only all envs
(``reset``) or one (``reset_at``), so done envs are reset one by one in a Python loop (only at
episode ends), or all at once when every env is done. Then the observations are read once.
A reset costs a few milliseconds whatever the number of envs (balance recomputes contacts over
the whole batch), so at episode ends it can take as long as the step itself.

VMAS's per-agent ``info`` tensors are not read, so they give no custom metrics.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch

from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import ConfigError, EnvError, did_you_mean
from shoal.vector.base import StepBatch, VecBackend

PREFIX = "vmas:"
# make_env arguments the backend sets itself: the flat batch depends on them.
_RESERVED = ("num_envs", "device", "seed", "wrapper", "dict_spaces", "terminated_truncated", "grad_enabled")


def is_vmas(env: Any) -> bool:
    return isinstance(env, str) and env.startswith(PREFIX)


def _scenario_names() -> list[str]:
    import vmas

    return sorted({*vmas.scenarios, *vmas.debug_scenarios, *vmas.mpe_scenarios})


def _gymnasium_space(space: Any) -> gymnasium.Space[Any] | None:
    """VMAS describes its spaces with the old ``gym`` package; shoal's specs read Gymnasium ones."""
    kind = type(space).__name__
    if kind == "Box":
        return gymnasium.spaces.Box(space.low, space.high, space.shape, np.float32)
    if kind == "Discrete":
        return gymnasium.spaces.Discrete(int(space.n))
    if kind == "MultiDiscrete":
        return gymnasium.spaces.MultiDiscrete(space.nvec)
    return None


def _make_env(scenario: str, num_envs: int, env_config: dict[str, Any] | None, seed: int | None) -> Any:
    """The VMAS env of ``scenario``, built strictly: reserved or unused ``env_config`` keys and
    VMAS's own argument checks become errors that name the env."""
    given = dict(env_config or {})
    env_config = dict(given)
    name = PREFIX + scenario
    reserved = [k for k in _RESERVED if k in env_config]
    if reserved:
        raise ConfigError(
            f"env '{name}': env_config may not set {reserved}; shoal sets {', '.join(_RESERVED)} "
            f"itself (num_envs and seed are trainer keys)."
        )
    try:
        import vmas
    except ImportError:
        raise EnvError(f"env '{name}' needs VMAS: pip install 'shoal[multiagent]'.") from None
    known = _scenario_names()
    if scenario not in known:
        raise EnvError(
            f"unknown VMAS scenario '{scenario}'.{did_you_mean(scenario, known)} "
            f"Valid ones include: {', '.join(known[:12])}, ... ({len(known)} in all)."
        )
    env_config.setdefault("continuous_actions", True)
    # VMAS only warns about scenario kwargs it did not use; a misspelt key should stop the run.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            env = vmas.make_env(
                scenario, num_envs=num_envs, device="cpu", seed=seed, terminated_truncated=True, **env_config
            )
        except (AssertionError, TypeError, ValueError) as e:
            # VMAS checks its arguments with bare asserts: the failing line is the message.
            detail = str(e) or traceback.extract_tb(e.__traceback__)[-1].line
            raise EnvError(
                f"env '{name}' cannot be built with env_config={given}: {type(e).__name__}: {detail}"
            ) from None
    for w in caught:
        if "passed but not used" in str(w.message):
            raise EnvError(
                f"env '{name}': {str(w.message).partition(' This will')[0]} "
                f"Check env_config against the scenario's make_world."
            )
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return env


def _shared_spaces(env: Any, name: str, agents: list[str]) -> tuple[gymnasium.spaces.Box, gymnasium.Space[Any]]:
    """The one observation and one action space all agents share (they share a policy), as
    Gymnasium spaces."""
    obs_spaces = [_gymnasium_space(s) for s in env.observation_space]
    act_spaces = [_gymnasium_space(s) for s in env.action_space]
    listing = "; ".join(f"{a}: {o} / {s}" for a, o, s in zip(agents, env.observation_space, env.action_space))
    boxes = [o for o in obs_spaces if isinstance(o, gymnasium.spaces.Box)]
    actions = [s for s in act_spaces if s is not None]
    if len(boxes) < len(obs_spaces) or len(actions) < len(act_spaces):
        raise EnvError(
            f"env '{name}': shoal reads Box observations and Box, Discrete or MultiDiscrete actions; "
            f"its agents have {listing}."
        )
    if any(o.shape != boxes[0].shape for o in boxes) or any(s != actions[0] for s in actions):
        raise EnvError(
            f"env '{name}': all agents share one policy, so they need one observation shape and one "
            f"action space; its agents have {listing}."
        )
    return boxes[0], actions[0]


class VmasBackend(VecBackend):
    autoreset = "same_step"
    unsaved_state = "VMAS simulator state is not plain data"

    def __init__(self, scenario: str, num_envs: int, env_config: dict[str, Any] | None = None, seed: int | None = None):
        name = PREFIX + scenario
        self.env = _make_env(scenario, num_envs, env_config, seed)
        agents = [agent.name for agent in self.env.agents]
        self.n_agents = n = len(agents)
        obs_space, act_space = _shared_spaces(self.env, name, agents)
        super().__init__(name, num_envs, obs_spec(obs_space), action_spec(act_space), rows_per_env=n)
        self.agents = agents

        # Env-major [N, n_agents, ...] views of the flat buffers: torch.stack(out=) fills them in one op.
        b = self.batch
        self._obs3 = b.obs.view(num_envs, n, *self.obs_spec.shape)
        self._final3 = b.final_obs.view(num_envs, n, *self.obs_spec.shape)
        self._reward2 = b.reward.view(num_envs, n)
        self._term2 = b.terminated.view(num_envs, n)
        self._trunc2 = b.truncated.view(num_envs, n)
        # VMAS wants [N, k] per agent (k = 1 for Discrete); clipping writes into this buffer.
        act = self.act_spec
        width = act.shape[0] if act.shape else 1
        dtype = torch.float32 if act.kind == "continuous" else torch.int64
        self._actions = torch.zeros(num_envs, n, width, dtype=dtype)
        self._agent_actions = list(self._actions.unbind(1))

    def reset(self, seed: int | Sequence[int] | None = None) -> None:
        if seed is not None and not isinstance(seed, int):
            raise ConfigError(
                f"env '{self.name}' is a VMAS scenario: all its envs are reset from one random stream, "
                f"so it cannot reset each env with a seed of its own (as GRPO's groups need); use "
                f"Gymnasium or PettingZoo envs for that."
            )
        # VMAS draws from its own random stream (saved and restored around each call), so this
        # seeds the envs without touching the global torch RNG the policy samples from.
        torch.stack(self.env.reset(seed=seed), dim=1, out=self._obs3)
        self._terminated[:] = False
        self._truncated[:] = False

    def send(self, actions: torch.Tensor, batch: StepBatch | None = None) -> None:
        self.bounded_actions(actions.reshape(self._actions.shape), out=self._actions)
        obs, rewards, terminated, truncated, _ = self.env.step(self._agent_actions)
        torch.stack(rewards, dim=1, out=self._reward2)
        self._term2.copy_(terminated.unsqueeze(1))
        self._trunc2.copy_(truncated.unsqueeze(1))
        done = terminated | truncated
        if not done.any():
            torch.stack(obs, dim=1, out=self._obs3)
            return
        if truncated.any():
            torch.stack(obs, dim=1, out=self._final3)
        if done.all():
            self.env.reset(return_observations=False)
        else:
            for i in done.nonzero().squeeze(1).tolist():
                self.env.reset_at(i, return_observations=False)
        obs = self.env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[0]
        torch.stack(obs, dim=1, out=self._obs3)
