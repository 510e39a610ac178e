"""Replay storage for off-policy learners: a preallocated circular TensorDict ``[N, C]``.

It is fed with the collector's ``[N, T+1]`` rollouts, so replay learners share the on-policy
data path: every agent row keeps ``C`` columns that advance together, and a step's next
observation is the next column of its row, not a second copy. Each ``add`` writes the ``T``
steps at the head and the rollout's slot ``T`` (the observation the next rollout starts from)
one column further, so the newest steps can be sampled at once; that column becomes the next
rollout's first step.

Episode ends need care where the next column does not hold the next observation:

- with same-step autoreset (shoal's backends) the step after a truncated episode's last one
  already belongs to the next episode, so the true final observation goes into a small circular
  side table (``final_obs_capacity`` entries, a few percent of the buffer). When an entry is
  overwritten before its step leaves the buffer, that step stops being sampleable;
- with next-step autoreset (Gymnasium's vector envs) the next column is that final observation,
  and the reset step after it is not a transition (``valid`` False), so it is never sampled;
- a terminated step needs no next observation: nothing is bootstrapped after it.

In a turn-based env (``EnvInfo.turn_based``: PettingZoo AEC games) an agent's row acts only on
its turns, and the columns between are other agents' turns. There a step's successor is the
row's next decision, not the next column (``shoal.buffers.turns``).

Observations keep their own dtype (uint8 images stay uint8), so a million 84x84 frames take
little more than their raw bytes (``benchmarks/replay_buffer.py`` measures it).

``sample`` draws stored steps uniformly (of one policy's rows when asked: the buffer serves as
one buffer per policy in multi-agent runs, without copying rows apart); ``gather`` reads them
with the windows of ``n`` steps from each on (rewards, episode ends, and where the stored row
stops going on in one piece); the learner computes the n-step returns from those
(``shoal.algos.returns.n_step_returns``: no bootstrap after a terminal step, a bootstrap from the
true final observation after a truncated one) and asks ``bootstrap`` for the observation after
the last step summed. The buffer computes no returns.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict

from shoal.buffers.rollout import FieldSpec, env_fields
from shoal.buffers.turns import DecisionLinks
from shoal.envs.spaces import EnvInfo

FINAL_OBS_SHARE = 64  # the side table of truncated episodes' final observations: capacity / 64 entries


def tensor_layout(state: Any) -> str:
    """A digest of the names, shapes and dtypes of the tensors in a (nested) state dict: two states
    with the same digest load into each other."""
    found: list[str] = []

    def walk(node: Any, at: str) -> None:
        if isinstance(node, torch.Tensor):
            found.append(f"{at}:{tuple(node.shape)}:{node.dtype}")
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{at}.{key}")
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, f"{at}.{i}")

    walk(state, "")
    return hashlib.sha1("\n".join(sorted(found)).encode()).hexdigest()[:12]


class Windows(NamedTuple):
    """``ReplayBuffer.windows``: the ``n`` stored steps from each sampled step ``[*S]`` on."""

    start: torch.Tensor
    """``[*S]`` the flat index of each window's first step (the sampled step)."""
    reward: torch.Tensor
    """``[*S, n]`` float32."""
    terminated: torch.Tensor
    """``[*S, n]`` bool."""
    truncated: torch.Tensor
    """``[*S, n]`` bool."""
    valid: torch.Tensor | None
    """``[*S, n]`` bool: the row goes on in one piece through the step (None: every step does)."""


class ReplayBuffer:
    """Circular ``[N, C]`` storage of the env fields (and ``fields``) of ``capacity`` agent steps
    in all: ``N`` agent rows, ``C = capacity // N`` columns each."""

    def __init__(
        self,
        env: EnvInfo,
        capacity: int,
        fields: dict[str, FieldSpec] | None = None,
        device: str | torch.device = "cpu",
        final_obs_capacity: int | None = None,
    ):
        n = env.num_rows
        if capacity < 2 * n:
            raise ValueError(f"a replay buffer of capacity {capacity} cannot hold two steps of each of {n} agent rows")
        self.num_rows, self.columns = n, capacity // n
        specs = env_fields(env) | (fields or {})
        specs.pop("env_done", None)  # where a turn-based game ended is folded into the links as it is stored
        self.storage = TensorDict(
            {
                key: torch.zeros(n, self.columns, *shape, dtype=dtype, device=device)
                for key, (shape, dtype) in specs.items()
            },
            batch_size=[n, self.columns],
            device=device,
        )
        """The stored steps ``[N, C]``, chronological along each row from the head (wrapping)."""
        self._flat = self.storage.view(-1)  # the same tensors as flat steps (a view costs 0.1 ms to make)
        self.sampleable = torch.zeros(n, self.columns, dtype=torch.bool, device=device)
        """Which stored steps are whole transitions that ``sample`` may draw."""
        self.head = 0
        """The column holding the newest observation, where the next ``add`` writes its first step."""
        self.size = 0
        """Columns of each row holding stored steps (at most ``C - 1``: the head is not a step yet)."""
        side = final_obs_capacity or max(n, capacity // FINAL_OBS_SHARE)
        obs_shape, obs_dtype = specs["obs"]
        self.final_obs = torch.zeros(side, *obs_shape, dtype=obs_dtype, device=device)
        """True final observations of truncated episodes (same-step autoreset), a circular table."""
        self.final_owner = torch.full((side,), -1, dtype=torch.long, device=device)  # flat step index of each entry
        self.final_slot = torch.full((n, self.columns), -1, dtype=torch.long, device=device)  # entry of each step
        self._final_next = 0  # the side table entry written next
        self._unlinked = False  # the next rollout does not go on from the stored rows (``unlink``)
        self.turns = DecisionLinks(n, self.columns, device) if env.turn_based else None
        """Turn-based envs: each decision's link to its agent's next one (None: the next column)."""
        step = self._flat[0]
        leaves = [*step.values(True, True), *step.select("obs").values(True, True)]  # nested: Dict observations
        self.row_bytes = sum(t.numel() * t.element_size() for t in leaves)
        """Bytes of one sampled step as a learner reads it: its stored fields and its next observation."""

    can_draw_ahead: bool = True
    """Minibatches of several steps may be drawn at once: the draws are uniform, and learning
    changes none of them (a prioritized buffer's do change)."""

    @property
    def capacity(self) -> int:
        return self.num_rows * self.columns

    def __len__(self) -> int:
        """Stored agent steps (sampleable or not)."""
        return self.num_rows * self.size

    @property
    def drawable(self) -> torch.Tensor:
        """``[N, C]``: where ``sample`` may draw, the stored whole transitions (a sequence buffer
        draws sequences instead: the start columns of the sampleable ones)."""
        return self.sampleable

    def add(self, rollout: TensorDict, truncations: Any = None) -> torch.Tensor:
        """Store a collected ``[N, T+1]`` rollout (``T < C``) and, with same-step autoreset, the
        final observations of its truncated episodes (the collector's ``truncations``); returns the
        flat indices (``row * C + column``) of the steps whose sampleability may have changed."""
        horizon = rollout.batch_size[1] - 1
        c = self.columns
        if horizon >= c:
            raise ValueError(f"a rollout of {horizon} steps per row does not fit {c} replay columns per row")
        cols = (self.head + torch.arange(horizon + 1, device=self.sampleable.device)) % c
        # the same columns as a slice where they do not wrap: a view written in place, which costs a
        # fraction of an indexed write (that matters when each env step is a rollout of its own)
        at = slice(self.head, self.head + horizon + 1) if self.head + horizon < c else cols
        # A rollout that does not go on from the stored head (the envs were reset in between) leaves
        # the step before it without its next observation: needed unless it terminated, or was
        # truncated with its final observation in the side table (not so with next-step autoreset,
        # whose final observation is the head the new rollout overwrites).
        previous = (self.head - 1) % c
        broken = None
        unlinked = self._unlinked
        if self.size:
            alone = self.storage["terminated"][:, previous] | (self.final_slot[:, previous] >= 0)
            broken = (rollout["first"][:, 0] | unlinked) & ~alone
        self._unlinked = False
        given = rollout.keys()
        for key, stored in self.storage.items():
            if key in given:
                stored[:, at] = rollout[key]
        newest = (self.head + horizon) % c  # slot T's column: the next rollout's first step
        self.sampleable[:, at] = rollout["valid"]
        self.sampleable[:, newest] = False
        self.final_slot[:, at] = -1
        changed = [(torch.arange(self.num_rows, device=cols.device).unsqueeze(1) * c + cols).reshape(-1)]
        if broken is not None and bool(broken.any()):
            rows = broken.nonzero().squeeze(1)
            self.sampleable[rows, previous] = False
            changed.append(rows * c + previous)
        # same-step autoreset: truncated steps' final observations go into the side table
        if truncations is not None and not truncations.next_step and len(truncations):
            device = cols.device  # the collector keeps its truncations where the envs step
            rows, steps = truncations.row.to(device), truncations.step.to(device)
            changed.append(self._store_final_obs(rows, cols[steps], truncations.obs.to(device)))
        if self.turns is not None:
            changed.append(self.turns.fold(self, rollout, cols, at, unlinked))
        self.head = newest
        self.size = min(self.size + horizon, c - 1)
        return torch.cat(changed)

    def _store_final_obs(self, rows: torch.Tensor, cols: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Put truncated steps' final observations into the side table; the steps whose entries they
        overwrite stop being sampleable (returned as flat indices)."""
        side = len(self.final_obs)
        flat = rows * self.columns + cols
        lost = flat[: max(len(flat) - side, 0)]  # more truncations in one rollout than entries: keep the newest
        self.sampleable.view(-1)[lost] = False
        flat, obs = flat[len(lost) :], obs[len(lost) :]
        entries = (self._final_next + torch.arange(len(flat), device=flat.device)) % side
        owners = self.final_owner[entries]
        old = owners[owners >= 0]
        evicted = old[self.final_slot.view(-1)[old] == entries[owners >= 0]]  # still pointing here
        self.sampleable.view(-1)[evicted] = False
        self.final_slot.view(-1)[evicted] = -1
        self.final_obs[entries] = obs
        self.final_owner[entries] = flat
        self.final_slot.view(-1)[flat] = entries
        self._final_next = int((self._final_next + len(flat)) % side)
        return torch.cat((lost, evicted))

    def holds(self, policy: int | None = None) -> bool:
        """Whether ``sample`` can draw a step (of policy ``policy``'s rows, when given)."""
        if policy is None:
            return bool(self.drawable.any())
        return bool((self.drawable & (self.storage["policy_id"] == policy)).any())

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, policy: int | None = None
    ) -> torch.Tensor:
        """Flat indices of ``batch_size`` stored steps drawn uniformly with replacement (of policy
        ``policy``'s rows only, when given)."""
        found: list[torch.Tensor] = []
        need = batch_size
        for attempt in range(24):  # each attempt draws more: a policy may own few of the rows
            index = self._candidates((2 * need + 16) << min(attempt, 10), generator)
            keep = self.drawable.view(-1)[index]
            if policy is not None:
                keep &= self.storage["policy_id"].view(-1)[index] == policy
            index = index[keep][:need]
            found.append(index)
            need -= len(index)
            if not need:
                return torch.cat(found)
        whose = "" if policy is None else f" of policy {policy}"
        raise RuntimeError(f"the replay buffer holds no steps{whose} to sample ({len(self)} stored)")

    def _candidates(self, count: int, generator: torch.Generator | None) -> torch.Tensor:
        """Random flat indices among the stored columns of every row."""
        if not self.size:
            raise RuntimeError("sample() called on an empty replay buffer; add() a rollout first")
        # drawn on the generator's device (the CPU), used on the storage's
        draw = torch.randint(self.num_rows * self.size, (count,), generator=generator).to(self.sampleable.device)
        row, age = draw // self.size, draw % self.size
        return row * self.columns + (self.head - 1 - age) % self.columns

    def gather(self, index: torch.Tensor, n_step: int = 1) -> tuple[TensorDict, Windows]:
        """The stored fields (``obs``, ``action``, ``reward``, ...) of the steps at flat ``index``
        ``[B]``, and the ``n_step`` steps from each on (``windows``), from which the learner computes
        n-step returns (``shoal.algos.returns.n_step_returns``) and then asks ``bootstrap`` for the
        observation to bootstrap from."""
        return self._flat[index], self.windows(index, n_step)

    def windows(self, index: torch.Tensor, n_step: int, limit: torch.Tensor | None = None) -> Windows:
        """The ``n_step`` stored steps from each flat ``index`` ``[*S]`` on along its row (along its
        decisions, in a turn-based env), as ``[*S, n_step]`` rewards and flags; ``valid`` is False
        at each step that is not itself a whole transition (not ``sampleable``): the newest
        observation (the head, not a step yet), a step whose next column does not go on from it
        (the envs were reset between two rollouts), a truncated step whose final observation the
        side table lost, a padding step, another agent's turn, a decision still waiting for its
        successor; and from ``limit`` steps on when given (``[*S]``: a sequence's steps stop at
        its end). A return stops before the first invalid step (``n_step_returns``)."""
        flat = self._flat
        if n_step == 1:  # a window of the step itself, which is stored whole
            at = index.unsqueeze(-1)
            return Windows(index, flat["reward"][at], flat["terminated"][at], flat["truncated"][at], None)
        if self.turns is None:
            c = self.columns
            col = index % c
            at = (index - col).unsqueeze(-1) + (col.unsqueeze(-1) + torch.arange(n_step, device=index.device)) % c
        else:  # each decision's successor, along the links
            steps = [index]
            for _ in range(n_step - 1):
                steps.append(self.turns.successor(steps[-1]))
            at = torch.stack(steps, -1)
        valid = self.sampleable.view(-1)[at]
        if limit is not None:
            valid &= torch.arange(n_step, device=index.device) < limit.unsqueeze(-1)
        return Windows(index, flat["reward"][at], flat["terminated"][at], flat["truncated"][at], valid)

    def bootstrap(self, index: torch.Tensor, last: torch.Tensor) -> dict[str, torch.Tensor]:
        """What to bootstrap from after the step ``last`` steps on from each flat ``index`` (both
        ``[*S]``): ``next_obs``, the observation after it (a truncated episode's true final
        observation), and ``next_action_mask`` when the env masks actions (all legal after a
        truncation, whose final observation comes with no mask)."""
        if self.turns is None:  # along the row, in the fewest ops: a replay phase's hot path
            c = self.columns
            col = index % c
            row_start = index - col
            step, next_index = row_start + (col + last) % c, row_start + (col + last + 1) % c
        else:
            step = index
            for k in range(int(last.max()) if last.numel() else 0):
                step = torch.where(last > k, self.turns.successor(step), step)
            next_index = self.turns.successor(step)
        final_slot = self.final_slot.view(-1)[step]
        truncated = self._flat["truncated"][step] & (final_slot >= 0)
        next_obs = self._flat["obs"][next_index]
        if bool(truncated.any()):
            next_obs[truncated] = self.final_obs[final_slot[truncated]]
        out = {"next_obs": next_obs}
        if "action_mask" in self._flat.keys():  # noqa: SIM118 (a TensorDict)
            out["next_action_mask"] = self._flat["action_mask"][next_index] | truncated.unsqueeze(-1)
        return out

    # ----- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "storage": self.storage.to_dict(),
            "sampleable": self.sampleable,
            "head": self.head,
            "size": self.size,
            "final_obs": self.final_obs,
            "final_owner": self.final_owner,
            "final_slot": self.final_slot,
            "final_next": self._final_next,
            "unlinked": self._unlinked,
        } | ({} if self.turns is None else self.turns.state_dict())

    def unlink(self) -> None:
        """The next ``add`` does not go on from the stored rows, whatever its ``first`` flags say:
        for a buffer loaded from another run, whose envs these are not. Each row's newest stored
        step then stops being a transition, unless it needs no next observation (it terminated, or
        its truncation's final observation is in the side table)."""
        self._unlinked = True

    def fits(self, state: dict[str, Any]) -> bool:
        """Whether ``state`` (a buffer's ``state_dict``) loads into this buffer: the same kind of
        buffer (each kind stores tensors of its own names) with tensors of the same shapes and
        dtypes, which a changed ``buffer_size``, number of env rows, sequence length or observation
        dtype changes."""
        return tensor_layout(state) == tensor_layout(self.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.storage.update_(state["storage"])
        for key in ("sampleable", "final_obs", "final_owner", "final_slot"):
            getattr(self, key).copy_(state[key])
        self.head, self.size, self._final_next = state["head"], state["size"], state["final_next"]
        self._unlinked = state.get("unlinked", False)  # a checkpoint written right after a population move
        if self.turns is not None:
            self.turns.load_state_dict(state)
