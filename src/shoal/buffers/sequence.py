"""Sequence replay for recurrent Q-networks (R2D2: Kapturowski et al. 2019, "Recurrent Experience
Replay in Distributed Reinforcement Learning"), over the ``ReplayBuffer`` storage.

The steps stay where ``ReplayBuffer`` keeps them (``[N, C]``, each row in a circle); what is
added is a table of the policy's recurrent state, one entry every ``stride`` columns of each row
(``[N, C / stride]``), filled by the collector as it acts (``collect(rollout, start_states)``
with ``start_states = buffer.rollout_states(T)``: the state each row carries into the step at
every ``stride``-th column). A sampled item is the window of ``sequence_length`` steps that
starts at a stored state: its first ``burn_in`` steps only warm the state up, from the stored
one, for the ``stride = sequence_length - burn_in`` steps learned from after them, so
consecutive windows overlap by ``burn_in`` and each step is learned from in exactly one.

A window is drawn only when all of its steps are stored, in one piece: none is the head (the
newest observation, not a step yet), unwritten, or older than the rest (overwritten since), and
at least one of its learned steps is a whole transition. Inside a window an episode may end and
the next begin: the learner zeroes the state where ``first`` is set, as the policy did when it
acted. ``C`` is rounded down to a multiple of ``stride`` so that the stored states keep their
columns as the head goes round; rollouts must then be whole strides.

``PrioritizedSequenceReplayBuffer`` draws windows by priority instead: one priority per window,
kept on the leaf of its start step in the trees of ``PrioritizedReplayBuffer``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from shoal.buffers.prioritized import PrioritizedReplayBuffer
from shoal.buffers.replay import ReplayBuffer, Windows
from shoal.buffers.rollout import FieldSpec
from shoal.envs.spaces import EnvInfo


class SequenceReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` that draws windows of ``sequence_length`` steps, each with the recurrent state
    stored at its start (``initial_states``: each policy's ``initial_state(1)``, the layout of the
    state table; the stateful ones must share it)."""

    # sample(k * B) rounds up to sequences_for(k * B) windows, which need not split into k minibatches
    # of sequences_for(B): a sequence minibatch is drawn per step
    can_draw_ahead = False

    def __init__(
        self,
        env: EnvInfo,
        capacity: int,
        fields: dict[str, FieldSpec] | None = None,
        device: str | torch.device = "cpu",
        *,
        initial_states: list[TensorDict],
        sequence_length: int,
        burn_in: int,
        final_obs_capacity: int | None = None,
    ):
        if not 0 <= burn_in < sequence_length:
            raise ValueError(f"burn_in={burn_in} must be in [0, sequence_length={sequence_length})")
        if env.turn_based:
            raise ValueError(
                f"'{env.name}' is turn-based, and a sequence holds consecutive steps, most of them other agents' "
                f"turns; use a feedforward Q-network, or algo=ppo with a recurrent core"
            )
        stride = sequence_length - burn_in
        n = env.num_rows
        columns = capacity // n // stride * stride
        need = window_columns(sequence_length, stride)
        if columns < need:
            raise ValueError(
                f"a sequence replay buffer of capacity {capacity} holds {columns} columns (whole strides of "
                f"{stride}) of each of {n} agent rows; a sequence of {sequence_length} steps needs {need}"
            )
        super().__init__(env, n * columns, fields, device, final_obs_capacity)
        layouts = [state for state in initial_states if not state.is_empty()]  # type: ignore[no-untyped-call]
        if not layouts or any(_layout(state) != _layout(layouts[0]) for state in layouts):
            raise ValueError(
                "a sequence replay buffer keeps one state table: the stateful policies must share one "
                f"layout (the same core and core_size), got {[_layout(state) for state in initial_states]}"
            )
        self.sequence_length, self.burn_in, self.stride = sequence_length, burn_in, stride
        self.initial_states = [state.to(device) for state in initial_states]
        self.states: TensorDict = layouts[0].to(device).expand(n, columns // stride).clone()
        """The recurrent state each row carried into the step at every ``stride``-th column."""
        self.sequence_drawable = torch.zeros(n, columns, dtype=torch.bool, device=device)
        """``[N, C]``: True at the start column of each window ``sample`` may draw."""
        self._incoming: list[TensorDict] = []  # the collector's staging tables, [N, T / stride] per policy

    @property
    def drawable(self) -> torch.Tensor:
        return self.sequence_drawable

    def rollout_states(self, horizon: int) -> list[TensorDict]:
        """Each policy's ``[N, horizon / stride]`` table for ``collect(rollout, start_states)`` to
        fill with the states of the next ``horizon``-step rollout, which ``add`` then stores."""
        if horizon % self.stride:
            raise ValueError(
                f"a rollout of {horizon} steps per row is not whole strides of {self.stride} (sequence_length "
                f"{self.sequence_length} - burn_in {self.burn_in}), where the states are stored"
            )
        segments = horizon // self.stride
        if not self._incoming or self._incoming[0].batch_size[1] != segments:
            self._incoming = [state.expand(self.num_rows, segments).clone() for state in self.initial_states]
        return self._incoming

    def add(self, rollout: TensorDict, truncations: Any = None) -> torch.Tensor:
        """``ReplayBuffer.add`` plus the states the collector stored in ``rollout_states(T)``; returns
        the flat start indices of the windows whose data or drawability changed."""
        horizon = rollout.batch_size[1] - 1
        staged = self._incoming
        if not staged or staged[0].batch_size[1] * self.stride != horizon:
            raise ValueError(
                f"a sequence replay buffer stores the states collected with this {horizon}-step rollout: "
                f"collect(rollout, start_states=buffer.rollout_states({horizon})) first"
            )
        start = self.head  # a whole number of strides, as every rollout is
        super().add(rollout, truncations)
        segments = torch.arange(horizon // self.stride, device=self.sampleable.device)
        slots = (start // self.stride + segments) % (self.columns // self.stride)
        table = self.states[:, slots]
        owner = rollout["policy_id"][:, : horizon : self.stride]  # who acted, so whose state it is
        for p, states in enumerate(staged):
            if not states.is_empty():  # type: ignore[no-untyped-call]
                table = states.where(owner == p, table)
        self.states[:, slots] = table
        return self._refresh_drawable(start, horizon)

    def _refresh_drawable(self, start: int, horizon: int) -> torch.Tensor:
        """Recompute which windows may be drawn (one vectorized pass over the table); return the
        windows that flipped or that meet the columns just written from ``start``."""
        c, s = self.columns, self.stride
        device = self.sampleable.device
        first_columns = torch.arange(0, c, s, device=device)
        age = (self.head - 1 - first_columns) % c  # of each window's first step; its last is sequence_length - 1 newer
        whole = (age >= self.sequence_length - 1) & (age < self.size)
        learned = self.sampleable.roll(-self.burn_in, 1).view(self.num_rows, c // s, s).any(2)
        drawable = whole & learned
        was = self.sequence_drawable[:, ::s]
        # the windows that reach into the written columns start up to (sequence_length - 1) before them
        reach = torch.arange(-((self.sequence_length - 1) // s), horizon // s + 1, device=device)
        touched = torch.zeros_like(drawable)
        touched[:, (start // s + reach) % (c // s)] = True
        rows, slot = ((drawable != was) | touched).nonzero().unbind(1)
        self.sequence_drawable[:, ::s] = drawable
        return rows * c + slot * s

    def _candidates(self, count: int, generator: torch.Generator | None) -> torch.Tensor:
        """Random start indices among the windows stored whole: those starting ``m`` strides behind
        the head, for ``m`` from ``ceil(sequence_length / stride)`` to ``size // stride``."""
        low, high = -(-self.sequence_length // self.stride), self.size // self.stride
        if high < low:
            raise RuntimeError(
                f"the sequence replay buffer holds {self.size} steps per row, not yet a whole sequence of "
                f"{self.sequence_length}; add() more rollouts first"
            )
        spread = high - low + 1
        draw = torch.randint(self.num_rows * spread, (count,), generator=generator).to(self.sampleable.device)
        row, back = draw // spread, low + draw % spread
        return row * self.columns + (self.head - back * self.stride) % self.columns

    def sequences_for(self, batch_size: int) -> int:
        """Windows that hold ``batch_size`` learned steps (rounded up)."""
        return -(-batch_size // self.stride)

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, policy: int | None = None
    ) -> torch.Tensor:
        """Flat start indices of ``sequences_for(batch_size)`` windows (``batch_size`` counts the
        steps learned from, as ``sgd_minibatch_size`` does), drawn uniformly with replacement (of
        the windows starting on policy ``policy``'s steps only, when given)."""
        return super().sample(self.sequences_for(batch_size), generator, policy)

    def gather(self, index: torch.Tensor, n_step: int = 1) -> tuple[TensorDict, Windows]:
        """The windows starting at flat ``index`` ``[B]``, as a TensorDict of batch size ``[B]``:
        every stored field of each of their steps (``[B, L, ...]``); ``mask [B, L]``: the steps
        learned from (past the burn-in, whole transitions, taken by the policy the window starts
        with); ``start_state [B]``: the stored state at each window's start. With them the
        ``[B, L, n_step]`` windows of ``ReplayBuffer.windows`` from each step on, which also stop
        at the sequence's end."""
        length, c = self.sequence_length, self.columns
        offset = torch.arange(length, device=index.device)
        col = index % c
        steps = (index - col).unsqueeze(1) + (col.unsqueeze(1) + offset) % c
        batch: TensorDict = self._flat[steps]
        windows = self.windows(steps, n_step, (length - offset).expand(len(index), length))
        owner = self.storage["policy_id"].view(-1)[index].unsqueeze(1)
        batch["mask"] = (offset >= self.burn_in) & self.sampleable.view(-1)[steps] & (batch["policy_id"] == owner)
        batch.batch_size = torch.Size([len(index)])
        batch["start_state"] = self.states[index // c, col // self.stride]
        return batch, windows

    def bootstrap(self, index: torch.Tensor, last: torch.Tensor) -> dict[str, torch.Tensor]:
        """``ReplayBuffer.bootstrap`` of the windows' steps ``[B, L]``, with ``last_step [B, L]``: the
        sequence position of the last step summed (the next observation is seen with the state
        after it)."""
        return super().bootstrap(index, last) | {
            "last_step": torch.arange(self.sequence_length, device=last.device) + last
        }

    # ----- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "states": self.states.to_dict(),
            "sequence_drawable": self.sequence_drawable,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.states.update_(state["states"])
        self.sequence_drawable.copy_(state["sequence_drawable"])


class PrioritizedSequenceReplayBuffer(PrioritizedReplayBuffer, SequenceReplayBuffer):
    """``SequenceReplayBuffer`` whose windows are drawn by priority (``PrioritizedReplayBuffer``: the
    sum and min trees hold one leaf per window, at its start step's index)."""

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, policy: int | None = None
    ) -> torch.Tensor:
        """Flat start indices of ``sequences_for(batch_size)`` windows drawn by priority."""
        return super().sample(self.sequences_for(batch_size), generator, policy)


def window_columns(sequence_length: int, stride: int) -> int:
    """Columns of a row that one whole window needs: the newest starts ``ceil(sequence_length /
    stride)`` strides behind the head, which is one more column."""
    return -(-sequence_length // stride) * stride + 1


def _layout(state: TensorDict) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape[1:]) for key, value in state.items()}
