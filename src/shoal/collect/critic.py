"""Centralized critic input (MAPPO, Yu et al. 2022, arXiv:2103.01955): what the value function sees.

With ``central_critic="team_obs"`` each agent row's critic input is the observations of every
agent of its env (rows are env-major, so that is the env's block of rows laid end to end),
followed by a one-hot of the row's agent slot, so one critic can tell the agents' values apart
(the paper's agent-specific global state). The actor still sees only its own observation.
"""

from __future__ import annotations

import torch


class TeamObs:
    def __init__(self, obs_dim: int, rows_per_env: int):
        self.k, self.obs_dim = rows_per_env, obs_dim
        self.team_dim = rows_per_env * obs_dim
        self.dim = self.team_dim + rows_per_env

    def init(self, critic_obs: torch.Tensor) -> None:
        """Fill the constant one-hot tail of a ``[N, T+1, dim]`` storage once."""
        rows = critic_obs.shape[0]
        critic_obs[..., self.team_dim:] = torch.eye(self.k).repeat(rows // self.k, 1).unsqueeze(1)

    def write(self, obs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the team part of ``out`` ``[R, dim]`` (whose tail ``init`` filled) from the rows'
        observations ``obs`` ``[R, obs_dim]``; returns ``out``."""
        envs = obs.shape[0] // self.k
        team = obs.reshape(envs, 1, self.team_dim).expand(envs, self.k, self.team_dim)
        out.view(envs, self.k, self.dim)[..., :self.team_dim].copy_(team)
        return out

    def build(self, obs: torch.Tensor) -> torch.Tensor:
        """A fresh ``[R, dim]`` critic input (off the hot path: bootstrapping truncated rows)."""
        out = torch.empty(obs.shape[0], self.dim)
        self.init(out.unsqueeze(1))
        return self.write(obs, out)
