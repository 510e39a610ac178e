"""Centralized critic inputs (MAPPO, Yu et al. 2022, arXiv:2103.01955): what the value function sees.

Each agent row's critic input is a global view of its env followed by a one-hot of the row's
agent slot, so one critic can tell the agents' values apart (the paper's agent-specific global
state). The actor still sees only its own observation. Two global views:

- ``TeamObs`` (``central_critic="team_obs"``): the observations of every agent of the env, laid
  end to end (rows are env-major, so that is the env's block of rows);
- ``EnvState`` (``central_critic="state"``): the env's own ``state()``, which the backend writes on
  every row of the env (``batch.state``, and ``batch.final_state`` before an autoreset).
"""

from __future__ import annotations

from typing import cast

import torch

from shoal.vector.base import StepBatch


class CriticInput:
    """``[global view, slot one-hot]`` rows; subclasses say where the global view comes from."""

    def __init__(self, view_dim: int, rows_per_env: int):
        self.k, self.view_dim = rows_per_env, view_dim
        self.dim = view_dim + rows_per_env

    def init(self, critic_obs: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """Fill the constant one-hot tail of a ``[N, ..., dim]`` storage once; ``slots`` gives each
        row's agent slot (default: env-major rows, ``0..k-1`` repeating)."""
        rows = critic_obs.shape[0]
        slots = torch.arange(rows) % self.k if slots is None else slots
        critic_obs[..., self.view_dim :] = torch.eye(self.k)[slots].view(rows, *(1,) * (critic_obs.dim() - 2), self.k)

    def _fresh(self, slots: torch.Tensor) -> torch.Tensor:
        """A new ``[rows, dim]`` input for rows of agent ``slots``, its tail filled (off the hot
        path: bootstrapping truncations)."""
        out = torch.empty(len(slots), self.dim)
        self.init(out, slots)
        return out

    def write(self, batch: StepBatch, obs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the global part of ``out`` ``[R, dim]`` for the batch whose observations
        are ``obs``; returns ``out``."""
        raise NotImplementedError

    def final(self, batch: StepBatch, rows: torch.Tensor) -> torch.Tensor:
        """The critic input of the batch's truncated ``rows`` at their true last step."""
        raise NotImplementedError


class TeamObs(CriticInput):
    def __init__(self, obs_dim: int, rows_per_env: int):
        super().__init__(rows_per_env * obs_dim, rows_per_env)

    def write(self, batch: StepBatch, obs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        envs = obs.shape[0] // self.k
        team = obs.reshape(envs, 1, self.view_dim).expand(envs, self.k, self.view_dim)
        out.view(envs, self.k, self.dim)[..., : self.view_dim].copy_(team)
        return out

    def final(self, batch: StepBatch, rows: torch.Tensor) -> torch.Tensor:
        team = batch.obs.to(torch.float32, copy=True)  # the team as each truncated row last saw it
        team[rows] = batch.final_obs[rows].to(torch.float32)
        return self.write(batch, team, self._fresh(batch.agent_id))[rows]


class EnvState(CriticInput):
    # Backends built with env_state=True (as the trainer does for central_critic="state") fill
    # batch.state and batch.final_state on every step.
    def write(self, batch: StepBatch, obs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out[:, : self.view_dim].copy_(cast(torch.Tensor, batch.state))
        return out

    def final(self, batch: StepBatch, rows: torch.Tensor) -> torch.Tensor:
        out = self._fresh(batch.agent_id[rows])
        out[:, : self.view_dim] = cast(torch.Tensor, batch.final_state)[rows]
        return out
