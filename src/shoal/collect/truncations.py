"""The truncated transitions of a rollout, each with its true last observation, for algorithms
that bootstrap from it: kept as the collector steps (same-step autoreset, where the env's next
observation already starts a new episode), read back from the rollout (next-step autoreset), or
joined from the shares of several Ray rollout workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from tensordict import TensorDict

from shoal.collect.critic import CriticInput
from shoal.collect.policies import PolicyMap
from shoal.vector.base import StepBatch

TruncatedRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, list[TensorDict]]
"""One batch's rows truncated at one step, as the collector keeps them: rows, steps, last
observations, critic inputs, each policy's state of those rows."""


@dataclass
class Truncations:
    """The truncated transitions of a rollout: ``row``, ``step`` and the true last observation
    ``obs`` (and centralized-critic input) of each, ``[K, ...]``; ``states``: each policy's state
    of those rows after acting at that step, the state a recurrent policy sees the last
    observation with (an empty list when no policy keeps state). With next-step autoreset the last
    observation is the rollout's next step (``next_step`` True), where the policies acted on it."""

    row: torch.Tensor
    step: torch.Tensor
    obs: torch.Tensor
    critic_obs: torch.Tensor | None
    states: list[TensorDict]
    next_step: bool = False

    def __len__(self) -> int:
        return len(self.row)


def truncated_rows(batch: StepBatch, t: int, critic: CriticInput | None, policies: PolicyMap) -> TruncatedRows:
    """``batch``'s rows truncated at step ``t`` (same-step autoreset: ``final_obs`` holds their
    true last observations), with each policy's state after acting at ``t``, what a recurrent
    policy saw the last observation with."""
    local = batch.truncated.nonzero().squeeze(-1)
    rows = local + batch.rows.start
    critic_obs = None if critic is None else critic.final(batch, local)
    states = [state[rows] for state in policies.states] if policies.stateful else []
    return rows, torch.full_like(rows, t), batch.final_obs[local].clone(), critic_obs, states


def gather_truncations(rollout: TensorDict, horizon: int, autoreset: str, kept: list[TruncatedRows]) -> Truncations:
    """The rollout's truncations: those the collector ``kept`` as it stepped, or with next-step
    autoreset those the rollout's flags mark (the true last observation is the next step's)."""
    critic = rollout.get("critic_obs", None)
    if autoreset == "next_step":
        row, step = rollout["truncated"][:, :horizon].nonzero().unbind(1)
        obs, critic_obs = rollout["obs"][row, step + 1], None if critic is None else critic[row, step + 1]
        return Truncations(row, step, obs, critic_obs, [], next_step=True)
    if not kept:
        none = torch.zeros(0, dtype=torch.long)
        return Truncations(none, none, rollout["obs"][:0, 0], None if critic is None else critic[:0, 0], [])
    rows, steps, obs, critics, states = zip(*kept)
    return Truncations(
        torch.cat(rows),
        torch.cat(steps),
        torch.cat(obs),
        None if critic is None else torch.cat(critics),
        [cast(TensorDict, torch.cat(per_policy)) for per_policy in zip(*states)],
    )


def join_truncations(parts: list[tuple[int, Truncations]], device: torch.device) -> Truncations:
    """The truncations of several workers' shares (each with its first row) as one rollout's."""
    first = parts[0][1]
    cut = [t for _, t in parts if len(t)]  # a share without truncations may list no states
    return Truncations(
        torch.cat([t.row + offset for offset, t in parts]).to(device),
        torch.cat([t.step for _, t in parts]).to(device),
        torch.cat([t.obs for _, t in parts]).to(device),
        None if first.critic_obs is None else torch.cat([t.critic_obs for _, t in parts]).to(device),  # type: ignore[misc]
        [cast(TensorDict, torch.cat(states)).to(device) for states in zip(*(t.states for t in cut))],
        first.next_step,
    )
