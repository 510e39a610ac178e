"""Prioritized replay (Schaul et al. 2016, arXiv:1511.05952) over the ``ReplayBuffer`` storage.

Step ``i`` is drawn with probability ``P(i) = p_i ** alpha / sum_k p_k ** alpha``, where ``p_i`` is
its last absolute TD error (plus a small epsilon), and new steps enter with the largest priority
seen so far, so each is replayed at least once soon. The learner weighs each drawn step's loss
by ``w_i = (n * P(i)) ** -beta / max_k w_k`` (``n`` stored steps; ``beta`` annealed to 1),
which undoes the bias of the skewed sampling: the buffer gives ``P(i)`` (``probabilities``) and
the smallest one (``min_probability``, whose weight is ``max_k w_k``), and the learner computes
the weights (``shoal.algos.returns.importance_weights``). A sum tree draws and a min tree gives
the smallest priority (``shoal.buffers.sumtree``), one pair per policy: a step is a leaf of its
policy's trees only, so each policy draws from its own rows as from a buffer of its own.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from shoal.buffers.replay import ReplayBuffer
from shoal.buffers.rollout import FieldSpec
from shoal.buffers.sumtree import SegmentTree
from shoal.envs.spaces import EnvInfo


class PrioritizedReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` whose ``sample`` draws by priority, with the ``probabilities`` the drawn
    steps had and ``update_priorities`` from their new TD errors."""

    can_draw_ahead = False  # each step's TD errors move the priorities the next draws from

    def __init__(
        self,
        env: EnvInfo,
        capacity: int,
        fields: dict[str, FieldSpec] | None = None,
        device: str | torch.device = "cpu",
        alpha: float = 0.6,
        num_policies: int = 1,
        **storage: Any,
    ):
        """``storage``: what a storage class mixed in after this one takes besides (e.g. the
        sequence buffer's sequence length)."""
        super().__init__(env, capacity, fields, device, **storage)
        self.alpha = alpha
        self.sums = [SegmentTree(self.capacity, "sum", device) for _ in range(num_policies)]
        self.mins = [SegmentTree(self.capacity, "min", device) for _ in range(num_policies)]
        self.max_priority = 1.0
        """The largest priority given so far: what new steps enter with."""

    def add(self, rollout: TensorDict, truncations: Any = None) -> torch.Tensor:
        changed = super().add(rollout, truncations)
        fresh = torch.tensor(self.max_priority**self.alpha, dtype=torch.float64, device=changed.device)
        drawable = self.drawable.view(-1)
        owner = self.storage["policy_id"].view(-1)
        for p, (sums, mins) in enumerate(zip(self.sums, self.mins)):
            mine = drawable[changed] if len(self.sums) == 1 else drawable[changed] & (owner[changed] == p)
            sums.update(changed, torch.where(mine, fresh, 0.0))
            mins.update(changed, torch.where(mine, fresh, torch.inf))
        return changed

    def holds(self, policy: int | None = None) -> bool:
        return self.sums[policy or 0].total() > 0

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, policy: int | None = None
    ) -> torch.Tensor:
        """Flat indices of ``batch_size`` steps (of policy ``policy``'s rows) drawn by priority,
        stratified over the total priority."""
        tree = self.sums[policy or 0]
        if tree.total() <= 0:
            whose = "" if policy is None else f" of policy {policy}"
            raise RuntimeError(f"the replay buffer holds no steps{whose} to sample ({len(self)} stored)")
        return tree.sample(batch_size, generator)

    def probabilities(self, index: torch.Tensor, policy: int | None = None) -> torch.Tensor:
        """``P(i)``, float64, of the steps at ``index`` among policy ``policy``'s steps: what the
        learner's importance weights (``shoal.algos.returns.importance_weights``) undo."""
        tree = self.sums[policy or 0]
        return tree[index] / tree.total()

    def min_probability(self, policy: int | None = None) -> float:
        """The smallest ``P(i)`` of any step policy ``policy`` may draw (the largest weight's)."""
        p = policy or 0
        return self.mins[p].total() / self.sums[p].total()

    def update_priorities(self, index: torch.Tensor, priority: torch.Tensor, policy: int | None = None) -> None:
        """New priorities (absolute TD errors, positive) of the steps at ``index``."""
        p = policy or 0
        priority = priority.detach().double()
        self.max_priority = max(self.max_priority, float(priority.max()))
        scaled = priority**self.alpha
        self.sums[p].update(index, scaled)
        self.mins[p].update(index, scaled)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "sums": [tree.state_dict() for tree in self.sums],
            "mins": [tree.state_dict() for tree in self.mins],
            "max_priority": self.max_priority,
            "alpha": self.alpha,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for trees, saved in ((self.sums, state["sums"]), (self.mins, state["mins"])):
            for tree, tree_state in zip(trees, saved):
                tree.load_state_dict(tree_state)
        self.max_priority = state["max_priority"]
        if (stored_alpha := state.get("alpha", self.alpha)) != self.alpha:  # a resume with another alpha
            self._rescale(stored_alpha)

    def _rescale(self, stored_alpha: float) -> None:
        """Turn the leaves, ``p ** stored_alpha``, into ``p ** alpha``: exact, except from
        ``stored_alpha=0``, whose leaves kept no priority, so each drawable step gets the largest."""
        every = torch.arange(self.sums[0].capacity, device=self.sums[0].tree.device)
        for sums, mins in zip(self.sums, self.mins):
            held = sums[every]
            if stored_alpha > 0:
                scaled = held ** (self.alpha / stored_alpha)
            else:
                scaled = torch.full_like(held, self.max_priority**self.alpha)
            drawable = held > 0
            sums.update(every, torch.where(drawable, scaled, 0.0))
            mins.update(every, torch.where(drawable, scaled, torch.inf))
