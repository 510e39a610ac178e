"""``batch_mode='complete_episodes'``: rollouts in which every row's data ends at an episode end.

The envs of a group step together, so they cannot all stop at an episode end at once. Each row
takes at least ``T`` new steps and then runs on to its env's next episode end, its *cut*; the group
stops when every row has one. What a row stepped past its cut (part of its next episode, perhaps
some short whole ones) is *carried*: kept aside, blanked in this rollout (``valid`` False, no
flags, zero reward) and written at the front of the next one, so no step is lost or counted twice.

A row of the storage, with capacity ``T + 2H`` (``H``: the longest episode):

    [ delivered | carried | new steps ...... cut | padding ]
      < H slots in all      >= T, ending at an episode end

The carried slots of a group start where its earliest cut ended; for the group's other rows the
slots before their own cut were delivered already and are padding (``delivered``). A carry is
shorter than ``H``: every row's cut comes within ``H`` steps of its ``T``-th new step, so the
latest cut is at most ``H - 1`` slots after the earliest, and the last slot stepped at most ``T +
2H - 1``. Padding is the price of fixed shapes; a learner that gathers the valid steps (PPO's
minibatches do) pays for it only in memory and in the advantage scan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from tensordict import TensorDict

from shoal.collect.episodes import StepInfos, numeric_items

FLAGS = ("valid", "done", "terminated", "truncated", "env_done")  # False where a slot is blanked (those present)
SUMS = ("reward",)  # zero where a slot is blanked

Truncated = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]  # rows, steps, obs, critic obs


def blank(rollout: TensorDict, raw_reward: torch.Tensor, rows: slice, start: int, mask: torch.Tensor) -> None:
    """Make slots padding: ``mask`` (``[rows, S]`` bool) over slots ``start .. start + S - 1``."""
    span = slice(start, start + mask.shape[1])
    for key in FLAGS:
        if key in rollout.keys():  # noqa: SIM118 (a TensorDict)
            rollout[key][rows, span].masked_fill_(mask, False)
    for key in SUMS:
        rollout[key][rows, span].masked_fill_(mask, 0.0)
    raw_reward[rows, span].masked_fill_(mask, 0.0)


class EpisodeCarry:
    """What each row stepped past its cut, kept between rollouts (and in checkpoints)."""

    def __init__(self, num_rows: int, keys: tuple[str, ...]):
        """``keys``: the rollout fields the collector writes (env fields and extras), all carried."""
        self.keys = keys
        self.length = np.zeros(num_rows, dtype=np.int64)
        """Slots carried to the front of the next rollout (the same for the rows of a group)."""
        self.delivered = np.zeros(num_rows, dtype=np.int64)
        """Of those, how many the last rollout held already: the row's front padding."""
        self.data: TensorDict | None = None  # [N, S] copies of the carried slots, allocated on first use
        self.raw_reward = torch.zeros(0, 0)
        self.truncated: Truncated | None = (
            None  # same-step autoreset: carried truncations, steps as in the next rollout
        )
        self.step_infos: StepInfos = {}  # infos of episodes that ended in carried slots, steps as in the next rollout

    def clear(self) -> None:
        """Forget the carried steps (the envs were reset)."""
        self.length[:] = 0
        self.delivered[:] = 0
        self.truncated, self.step_infos = None, {}

    def restore(self, rollout: TensorDict, raw_reward: torch.Tensor) -> None:
        """Write the carried slots at the front of ``rollout``, the delivered ones as padding."""
        width = int(self.length.max())
        if width == 0 or self.data is None:
            return
        rollout.select(*self.keys)[:, :width].update_(self.data[:, :width])
        raw_reward[:, :width].copy_(self.raw_reward[:, :width])
        front = torch.arange(width) < torch.from_numpy(self.delivered)[:, None]
        blank(rollout, raw_reward, slice(None), 0, front)

    def keep(
        self, rollout: TensorDict, raw_reward: torch.Tensor, rows: slice, cut: npt.NDArray[np.int64], end: int
    ) -> int:
        """Carry what ``rows`` (a group) stepped after their ``cut`` slots, up to slot ``end`` (its
        current observation, which the next rollout acts on), and blank it here; returns the first
        carried slot."""
        start = int(cut.min()) + 1
        width = end - start
        if self.data is None:  # a carry is shorter than H, and the T + 2H + 1 slots hold 2H
            size = rollout.batch_size[1] // 2
            self.data = rollout.select(*self.keys)[:, :size].clone()
            self.raw_reward = torch.zeros(rollout.batch_size[0], size)
        if width:
            self.data[rows, :width] = rollout.select(*self.keys)[rows, start:end]
            self.raw_reward[rows, :width] = raw_reward[rows, start:end]
            after = torch.arange(start, end) > torch.from_numpy(cut)[:, None]
            blank(rollout, raw_reward, rows, start, after)
        self.length[rows] = width
        self.delivered[rows] = cut + 1 - start
        return start

    def split_truncated(
        self, truncated: Truncated, cut: npt.NDArray[np.int64], start: npt.NDArray[np.int64]
    ) -> Truncated:
        """Same-step autoreset: the truncations after each row's cut move to the next rollout
        (their steps shifted by the row's first carried slot ``start``); returns the rest."""
        rows, steps, obs, critic = truncated
        later = steps > torch.from_numpy(cut)[rows]
        moved = rows[later]
        self.truncated = (
            moved,
            steps[later] - torch.from_numpy(start)[moved],
            obs[later],
            None if critic is None else critic[later],
        )
        here = ~later
        return rows[here], steps[here], obs[here], None if critic is None else critic[here]

    def split_infos(self, step_infos: StepInfos, cut: npt.NDArray[np.int64], start: npt.NDArray[np.int64]) -> StepInfos:
        """The infos of episodes that ended after their row's cut move to the next rollout; returns the rest."""
        here: StepInfos = {}
        self.step_infos = {}
        for t, infos in step_infos.items():
            for row, info in infos.items():
                if t > cut[row]:
                    self.step_infos.setdefault(t - int(start[row]), {})[row] = info
                else:
                    here.setdefault(t, {})[row] = info
        return here

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors and numbers; the carried infos keep their numeric entries only (what the
        episode metrics read)."""
        return {
            "keys": list(self.keys),
            "length": torch.from_numpy(self.length.copy()),
            "delivered": torch.from_numpy(self.delivered.copy()),
            "data": None if self.data is None else self.data.to_dict(),
            "raw_reward": self.raw_reward.clone(),
            "truncated": self.truncated,
            "step_infos": {
                t: {row: numeric_items(info) for row, info in infos.items()} for t, infos in self.step_infos.items()
            },
        }

    @classmethod
    def from_state(cls, num_rows: int, state: dict[str, Any]) -> EpisodeCarry:
        carry = cls(num_rows, tuple(state["keys"]))
        carry.load_state_dict(state)
        return carry

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.length[:] = state["length"].numpy()
        self.delivered[:] = state["delivered"].numpy()
        data = state["data"]
        self.data = None if data is None else TensorDict(data, batch_size=state["raw_reward"].shape[:2])
        self.raw_reward = state["raw_reward"].clone()
        self.truncated = state["truncated"]
        self.step_infos = state["step_infos"]
