"""Replay in turn-based envs: each decision linked to its agent's next one.

In a turn-based env (PettingZoo AEC games) an agent's row acts only on its turns; the columns
between are the other agents' turns, on which the row still gets rewards (the loser of a board
game gets its -1 on the winner's move) and may get its done flag. A replay buffer there takes a
decision's successor to be the row's next decision, not the next column. ``DecisionLinks`` keeps
``link``, the columns from each decision to that successor, and folds the rewards and the
episode end of the turns between into the decision, as the on-policy returns fold them.

A decision becomes sampleable once its agent acts again or its episode ends, so the newest
decision of each row waits (``open``), possibly over several rollouts. A waiting decision is
dropped, never linked, when the rollout does not go on from it (a new episode at its first step,
``ReplayBuffer.unlink``) or when the buffer writes over its column before its agent moves again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

if TYPE_CHECKING:
    from shoal.buffers.replay import ReplayBuffer


class DecisionLinks:
    """The decision links of a ``[N, C]`` replay buffer's rows."""

    def __init__(self, rows: int, columns: int, device: str | torch.device):
        self.link = torch.zeros(rows, columns, dtype=torch.int32, device=device)
        """``[N, C]`` columns from each decision to its successor, its row's next decision; 0 while
        it waits for one, and where its episode ends with it (a terminated one bootstraps from
        nothing, a truncated one from its final observation)."""
        self.open = torch.full((rows,), -1, dtype=torch.long, device=device)
        """Each row's decision awaiting its successor, as a flat index (-1: none)."""

    def fold(
        self, buffer: ReplayBuffer, rollout: TensorDict, cols: torch.Tensor, at: slice | torch.Tensor, unlinked: bool
    ) -> torch.Tensor:
        """Link each row's decisions to their successors through the ``rollout`` ``buffer`` has just
        stored at columns ``cols`` (``at``: the same as a slice where they do not wrap), folding the
        rewards and episode ends of the other agents' turns into the decision before them;
        ``unlinked``: the rollout does not go on from the stored rows. Returns the flat indices of
        the decisions it closed.

        A loop over the rollout's steps, each vectorized over the rows: replay rollouts are a few
        steps (``train_freq``), and a decision's successor may lie any number of them ahead."""
        c, horizon = buffer.columns, len(cols) - 1
        rows = torch.arange(buffer.num_rows, device=cols.device)
        flat = buffer._flat  # the storage as flat steps, as the buffer keeps it (a view costs 0.1 ms to make)
        reward, terminated, truncated, done = (flat[key] for key in ("reward", "terminated", "truncated", "done"))
        sampleable, link, final_slot = buffer.sampleable.view(-1), self.link.view(-1), buffer.final_slot.view(-1)
        opened = self.open
        # an open decision whose column this rollout wrote over, or whose row does not go on from it
        overwritten = torch.zeros(c, dtype=torch.bool, device=cols.device)
        overwritten[cols] = True
        opened.masked_fill_((opened >= 0) & (overwritten[opened % c] | unlinked), -1)
        self.link[:, at] = 0
        acts, ended, first = rollout["valid"], rollout["done"], rollout["first"]
        closed = []
        for u in range(horizon):
            opened.masked_fill_(first[:, u], -1)  # a new episode: an end would have closed it
            here = rows * c + cols[u]
            pending = opened >= 0
            decision = opened.clamp(min=0)
            joins = pending & ~acts[:, u]  # another agent's turn, or the agent's own end off its turn
            reward.index_add_(0, decision, torch.where(joins, reward[here], 0.0))
            ends = (joins & ended[:, u]).nonzero().squeeze(1)
            if len(ends):
                into, step = decision[ends], here[ends]
                terminated[into], truncated[into], done[into] = terminated[step], truncated[step], True
                entry = final_slot[step]  # a truncated end's final observation now belongs to the decision
                final_slot[into], final_slot[step] = entry, -1
                kept = entry >= 0
                buffer.final_owner[entry[kept]] = into[kept]
                sampleable[into] = ~truncated[step] | kept
                closed.append(into)
            again = (pending & acts[:, u]).nonzero().squeeze(1)  # the agent acts again: its successor
            if len(again):
                into = decision[again]
                link[into] = ((cols[u] - into % c) % c).int()
                sampleable[into] = True
                closed.append(into)
            # a new decision waits for its successor, unless its episode ends with it; an end closes
            # whatever the row had open
            starts = acts[:, u] & ~ended[:, u]
            sampleable[here[starts]] = False
            opened.copy_(torch.where(starts, here, torch.where(ended[:, u], -1, opened)))
        return torch.cat(closed) if closed else rows[:0]

    def successor(self, index: torch.Tensor) -> torch.Tensor:
        """The flat index of the decision each decision at flat ``index`` links to."""
        columns = self.link.shape[1]
        col = index % columns
        return index - col + (col + self.link.view(-1)[index]) % columns

    def state_dict(self) -> dict[str, Any]:
        return {"link": self.link, "open": self.open}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.link.copy_(state["link"])
        self.open.copy_(state["open"])
