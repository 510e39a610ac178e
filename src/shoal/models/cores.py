"""LSTM and GRU cores: one step at a time (acting, and the reference replay), or a whole batch of
segments in one fused call (learning).

A segment ``[S, L]`` replays from its stored start state and starts again from zeros at every
episode start inside it (``first``). ``run_segments`` cuts each segment at its episode starts into
pieces, each piece a sequence with its own initial state (the stored one for a segment's first
piece, zeros for the others), lays the pieces out as rows of equal length (padded at their ends),
and runs them all in one call of torch's fused RNN (``torch.lstm`` / ``torch.gru``, what
``nn.LSTM`` / ``nn.GRU`` run) on the cell's own parameters. The cost is then a fixed handful of ops
per minibatch, however many episodes start inside it, instead of a Python step (and a masked
reset) per time step: forward and backward run their time loop in C++. (A packed sequence of
varying batch sizes takes a slower path in torch's CPU kernel, about 6x here.) It computes the
same recurrence as ``step_cell`` step by step, equal to float rounding: the kernel projects every
step's input in one matrix product, which sums in another order (``tests/test_recurrent_fused.py``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import nn

Core = Literal["lstm", "gru"]


def make_cell(core: Core, feature_dim: int, size: int) -> nn.LSTMCell | nn.GRUCell:
    """An LSTM or GRU cell with orthogonal weights and zero biases."""
    cell: nn.LSTMCell | nn.GRUCell = nn.LSTMCell(feature_dim, size) if core == "lstm" else nn.GRUCell(feature_dim, size)
    for name, param in cell.named_parameters():
        if name.startswith("weight"):
            nn.init.orthogonal_(param)
        else:
            nn.init.zeros_(param)
    return cell


def cell_params(cell: nn.Module) -> list[torch.Tensor]:
    """The cell's weights and biases in the order torch's RNN kernels take them."""
    return [getattr(cell, name) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


def step_cell(cell: nn.Module, features: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """One step of ``cell``: the new state (``(h, c)`` for an LSTM, ``(h,)`` for a GRU). The
    cell's kernel is called as the module calls it, without the module's call overhead and input
    checks (a step of acting is a few small ops, where that overhead shows)."""
    params = cell_params(cell)
    if isinstance(cell, nn.LSTMCell):
        h, c = torch.lstm_cell(features, (state[0], state[1]), *params)
        return h, c
    return (torch.gru_cell(features, state[0], *params),)


class Pieces(NamedTuple):
    """Segments ``[S, L]`` cut at their episode starts into ``P`` pieces, each laid out as a row of
    ``longest`` steps (the longest piece's length; a shorter piece is padded at its end, which no
    step of it reads): ``place [S * L]`` (each step's place in the ``[P * longest]`` rows),
    ``segment [P]`` (the segment of each piece) and ``carried [P]`` (the piece continues from its
    segment's stored start state; the others start from zeros)."""

    place: torch.Tensor
    segment: torch.Tensor
    carried: torch.Tensor
    longest: int


def cut_at_resets(first: torch.Tensor) -> Pieces:
    """The pieces of segments ``first [S, L]`` (True where an episode starts), computed once per
    minibatch and shared by the towers."""
    length = first.shape[1]
    starts = first.clone()
    starts[:, 0] = True
    starts = starts.flatten()
    begin = starts.nonzero().squeeze(1)  # flat step where each piece begins
    piece = starts.cumsum(0) - 1  # the piece of each step
    lengths = torch.diff(begin, append=begin.new_tensor([len(starts)]))
    longest = int(lengths.max())
    at = torch.arange(len(starts), device=first.device) - begin[piece]  # step within its piece
    carried = (begin % length == 0) & ~first.flatten()[begin]
    return Pieces(piece * longest + at, begin // length, carried, longest)


def run_segments(
    cell: nn.Module, features: torch.Tensor, start: tuple[torch.Tensor, ...], pieces: Pieces
) -> torch.Tensor:
    """The core's output ``h`` ``[S, L, size]`` at every step of segments ``features [S, L, F]``
    replayed from ``start`` (``(h, c)`` or ``(h,)``, each ``[S, size]``), from zeros where an
    episode starts (``pieces``: ``cut_at_resets(first)``)."""
    segments, length, width = features.shape
    rows = len(pieces.segment)
    padded = features.new_zeros(rows * pieces.longest, width)
    padded = padded.index_copy(0, pieces.place, features.flatten(0, 1)).view(rows, pieces.longest, width)
    keep = pieces.carried.unsqueeze(1)
    hx = tuple(torch.where(keep, s[pieces.segment], 0.0).unsqueeze(0) for s in start)
    params = cell_params(cell)
    # torch's fused RNN, as nn.LSTM / nn.GRU call it (batch_first), on the cell's own parameters
    if isinstance(cell, nn.LSTMCell):
        out = torch.lstm(padded, hx, params, True, 1, 0.0, cell.training, False, True)[0]
    else:
        out = torch.gru(padded, hx[0], params, True, 1, 0.0, cell.training, False, True)[0]
    return out.flatten(0, 1)[pieces.place].view(segments, length, -1)
