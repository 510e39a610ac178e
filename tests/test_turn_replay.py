"""Replay in turn-based envs against a slow reference: each decision's successor is its agent's
next decision, the rewards of the other agents' turns fold into it, an end off the agent's turn
closes it, and n-step returns count decisions. Then a checkpoint of a buffer with decisions still
waiting, and the cases that drop a waiting decision. The learners on real games are in
test_turn_learning.py."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from test_replay import GAMMA, lost_finals

import shoal
from shoal.algos.off_policy import transitions
from shoal.buffers import PrioritizedReplayBuffer, ReplayBuffer
from shoal.collect.collector import Truncations
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from shoal.vector import make_backend
from tests.test_multi_agent_dict import TurnsEnv


def turn_info(rows: int, players: int) -> EnvInfo:
    box, actions = obs_spec(gym.spaces.Box(-1e9, 1e9, (2,))), action_spec(gym.spaces.Discrete(3))
    return EnvInfo("turns", box, actions, rows // players, players, turn_based=True)


@dataclasses.dataclass
class Decision:
    """One decision as the reference sees it: what it learns from, once its agent acts again or
    its episode ends (``closed``)."""

    obs: torch.Tensor
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    next_obs: torch.Tensor | None = None
    closed: bool = False


def empty_rollout(rows: int, slots: int) -> TensorDict:
    """The collector's fields for ``rows`` agent rows and ``slots`` (T+1) steps, all zero."""
    flags = ("done", "terminated", "truncated", "first", "valid")
    return TensorDict(
        {
            "obs": torch.zeros(rows, slots, 2),
            "action": torch.zeros(rows, slots, dtype=torch.long),
            "reward": torch.zeros(rows, slots),
            "policy_id": torch.zeros(rows, slots, dtype=torch.long),
            **{key: torch.zeros(rows, slots, dtype=torch.bool) for key in flags},
        },
        batch_size=[rows, slots],
    )


class TurnGames:
    """Random turn-based games of ``players`` agents each, as the collector's ``[N, T+1]``
    rollouts (same-step autoreset). One agent moves per step, in turn among those still playing;
    every playing agent gets a random reward each step; a waiting agent may leave (terminated), and
    the game may end for everyone (terminated, or truncated with each agent's true final
    observation). Observations are ``(row, serial)``, a final one ``(row, -serial)``.
    ``decisions[row]`` is the reference: every decision of the row, in order."""

    def __init__(self, games: int, players: int, seed: int, end: float = 0.2, leave: float = 0.05):
        self.games, self.players, self.end, self.leave = games, players, end, leave
        self.rng = np.random.default_rng(seed)
        self.serial = 0
        rows = games * players
        self.obs = [self._new(r) for r in range(rows)]
        self.first = [True] * rows
        self.playing = [True] * rows
        self.mover = [0] * games
        self.open: list[Decision | None] = [None] * rows
        self.decisions: list[list[Decision]] = [[] for _ in range(rows)]

    def _new(self, row: int, sign: float = 1.0) -> torch.Tensor:
        self.serial += 1
        return torch.tensor([row, sign * self.serial], dtype=torch.float32)

    def _close(self, row: int, terminated: bool, truncated: bool, next_obs: torch.Tensor | None) -> None:
        decision = self.open[row]
        if decision is not None:
            decision.terminated, decision.truncated, decision.next_obs = terminated, truncated, next_obs
            decision.closed = True
        self.open[row] = None

    def rollout(self, horizon: int) -> tuple[TensorDict, Truncations]:
        n = self.games * self.players
        td = empty_rollout(n, horizon + 1)
        trunc_rows, trunc_steps, finals = [], [], []
        for t in range(horizon + 1):
            for r in range(n):
                td["obs"][r, t], td["first"][r, t] = self.obs[r], self.first[r]
            if t == horizon:
                break
            for g in range(self.games):
                rows = range(g * self.players, (g + 1) * self.players)
                mover = g * self.players + self.mover[g]
                td["valid"][mover, t] = True
                self._close(mover, False, False, self.obs[mover])  # its previous decision's successor
                self.open[mover] = Decision(self.obs[mover])
                self.decisions[mover].append(self.open[mover])
                end = self.rng.random()
                game_over, cut = end < self.end / 2, self.end / 2 <= end < self.end
                for r in rows:
                    self.first[r] = False
                    if not self.playing[r]:
                        self.obs[r] = self._new(r)  # padding until the game ends
                        continue
                    reward = float(self.rng.normal())
                    td["reward"][r, t] = reward
                    if self.open[r] is not None:
                        self.open[r].reward += reward
                    leaves = r != mover and not game_over and not cut and self.rng.random() < self.leave
                    if game_over or cut or leaves:
                        td["terminated"][r, t], td["truncated"][r, t], td["done"][r, t] = not cut, cut, True
                        final = self._new(r, -1.0)
                        if cut:
                            trunc_rows.append(r), trunc_steps.append(t), finals.append(final)
                        self._close(r, not cut, cut, final)
                        self.playing[r] = False
                    self.obs[r] = self._new(r)
                live = [r for r in rows if self.playing[r]]
                if not live:  # the game is over: a new one starts in the same step
                    for r in rows:
                        self.playing[r], self.first[r] = True, True
                    self.mover[g] = 0
                    continue
                after = [r for r in live if r > mover] + live
                self.mover[g] = after[0] - g * self.players
        obs = torch.stack(finals) if finals else torch.zeros(0, 2)
        ids = (torch.tensor(trunc_rows, dtype=torch.long), torch.tensor(trunc_steps, dtype=torch.long))
        return td, Truncations(*ids, obs, None, [])

    def reference(self, obs: torch.Tensor, n_step: int, lost: set[float]) -> tuple[float, torch.Tensor | None, float]:
        """(n-step return, next obs, discount) of the decision taken from ``obs``, over its agent's
        next decisions: it stops at an episode's end, before a decision still waiting for its
        successor, and before a truncated one whose final observation the buffer lost."""
        decisions = self.decisions[int(obs[0])]
        at = next(i for i, d in enumerate(decisions) if torch.equal(d.obs, obs))
        total, discount, next_obs = 0.0, 1.0, None
        for k in range(n_step):
            d = decisions[at + k] if at + k < len(decisions) else None
            if k and (d is None or not d.closed or (d.truncated and float(d.obs[1]) in lost)):
                break
            assert d is not None and d.closed
            total += discount * d.reward
            discount *= GAMMA
            next_obs = d.next_obs
            if d.terminated:
                return total, None, 0.0
            if d.truncated:
                break
        return total, next_obs, discount


def check_against_reference(
    buffer: ReplayBuffer, games: TurnGames, n_step: int, generator: torch.Generator, lost: set[float]
) -> int:
    index = buffer.sample(64, generator)
    batch = transitions(buffer, index, n_step=n_step, gamma=GAMMA)
    for i in range(len(index)):
        obs = batch["obs"][i]
        assert float(obs[1]) > 0 and float(obs[1]) not in lost
        reward, next_obs, discount = games.reference(obs, n_step, lost)
        assert batch["reward"][i].item() == pytest.approx(reward, abs=1e-4)
        assert batch["discount"][i].item() == pytest.approx(discount, abs=1e-6)
        if discount:
            assert torch.equal(batch["next_obs"][i], next_obs), (obs, batch["next_obs"][i], next_obs)
    return len(index)


@settings(max_examples=20, deadline=None)
@given(
    players=st.integers(1, 3),
    games=st.integers(1, 3),
    horizons=st.lists(st.integers(1, 7), min_size=4, max_size=10),
    n_step=st.sampled_from([1, 3]),
    side=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**16),
)
def test_turn_based_transitions_match_the_reference(players, games, horizons, n_step, side, seed):
    rows = games * players
    play = TurnGames(games, players, seed)
    buffer = ReplayBuffer(turn_info(rows, players), rows * 40, final_obs_capacity=side)  # wraps mid-run
    generator = torch.Generator().manual_seed(seed)
    for horizon in horizons:
        buffer.add(*play.rollout(horizon))
        lost = lost_finals(buffer)
        # every closed decision still stored is drawable, and nothing else is
        stored = {float(o[1]) for o in buffer.storage["obs"].view(-1, 2)}
        expected = {
            float(d.obs[1])
            for row in play.decisions
            for d in row
            if d.closed and float(d.obs[1]) in stored and not (d.truncated and float(d.obs[1]) in lost)
        }
        drawable = {float(o[1]) for o in buffer.storage["obs"][buffer.sampleable]}
        assert drawable == expected
        if buffer.holds():
            check_against_reference(buffer, play, n_step, generator, lost)


def test_the_waiting_decision_is_drawn_only_once_its_agent_acts_again():
    """Two players, one game: a decision is not sampleable until the next rollout shows its agent's
    next move, and the loser's reward on the winner's move reaches its last decision."""
    play = TurnGames(1, 2, seed=0, end=0.0, leave=0.0)
    buffer = ReplayBuffer(turn_info(2, 2), 2 * 30)
    buffer.add(*play.rollout(1))  # player 0 moved; player 1 not yet
    assert not buffer.holds(), "player 0's decision waits for its next move"
    buffer.add(*play.rollout(1))  # player 1 moved
    assert not buffer.holds()
    buffer.add(*play.rollout(1))  # player 0 moved again: its first decision is whole
    assert buffer.sampleable.sum().item() == 1 and bool(buffer.sampleable[0, 0])
    first = play.decisions[0][0]
    assert buffer.storage["reward"][0, 0].item() == pytest.approx(first.reward)
    assert int(buffer.turns.link[0, 0]) == 2


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_stored_buffer_with_waiting_decisions_goes_on_as_the_original(prioritized):
    def make() -> ReplayBuffer:
        if prioritized:
            return PrioritizedReplayBuffer(turn_info(6, 3), 6 * 30, alpha=0.6)
        return ReplayBuffer(turn_info(6, 3), 6 * 30)

    play = TurnGames(2, 3, seed=5)
    original = make()
    for _ in range(5):
        original.add(*play.rollout(3))
    assert bool((original.turns.open >= 0).any()), "some decisions wait across the checkpoint"
    copy = make()
    copy.load_state_dict(original.state_dict())
    for _ in range(5):
        rollout, truncations = play.rollout(3)
        original.add(rollout.clone(), truncations)
        copy.add(rollout, truncations)
    for key in ("sampleable", "final_slot"):
        assert torch.equal(getattr(original, key), getattr(copy, key))
    for key in ("link", "open"):
        assert torch.equal(getattr(original.turns, key), getattr(copy.turns, key))
    if prioritized:
        for a, b in zip(original.sums + original.mins, copy.sums + copy.mins):
            assert torch.equal(a.tree, b.tree)
    assert (original.storage == copy.storage).all()
    generator = torch.Generator().manual_seed(0)
    assert check_against_reference(copy, play, 3, generator, lost_finals(copy)) == 64
    assert original.fits(copy.state_dict())
    plain = ReplayBuffer(dataclasses.replace(turn_info(6, 3), turn_based=False), 6 * 30)
    assert not plain.fits(original.state_dict()), "a turn-based buffer's links are part of its layout"


def steps_of(valid: list[list[bool]], terminated: list[list[bool]] | None = None, first: bool = False) -> TensorDict:
    """A rollout of the given ``[rows][T+1]`` valid (and terminated) flags, each step's reward 1 and
    each observation its own number; ``first``: a new episode at its first step."""
    rows, slots = len(valid), len(valid[0])
    td = empty_rollout(rows, slots)
    td["obs"] = torch.arange(rows * slots, dtype=torch.float32).view(rows, slots, 1).expand(rows, slots, 2).clone()
    td["reward"][:] = 1.0
    td["valid"] = torch.tensor(valid)
    if terminated is not None:
        td["terminated"] = torch.tensor(terminated)
        td["done"] = td["terminated"].clone()
    td["first"][:, 0] = first
    return td


def test_an_end_on_the_agents_own_move_closes_what_it_had_open():
    """Agents that move together: row 0 ends on its own move at step 1 and moves again at step 3
    (no new-episode flag: an agent of a native env that starts again alone). Its decision at step
    0 bootstraps from step 1; the one at step 1 ends there and takes no later reward."""
    buffer = ReplayBuffer(turn_info(2, 2), 2 * 20)
    valid = [[True, True, False, True, True], [True, True, True, True, False]]
    ended = [[False, True, False, False, False], [False] * 5]
    buffer.add(steps_of(valid, terminated=ended))
    assert buffer.turns.link[0, :2].tolist() == [1, 0] and buffer.storage["reward"][0, :2].tolist() == [1.0, 1.0]
    assert buffer.sampleable[0, :4].tolist() == [True, True, False, False]  # step 3 waits for step 4
    assert bool(buffer.storage["terminated"][0, 1]) and int(buffer.turns.open[0]) == 3


@pytest.mark.parametrize("how", ["unlink", "first"])
def test_a_rollout_that_does_not_go_on_from_the_stored_rows_drops_the_waiting_decisions(how):
    """After ``unlink`` (a buffer taken from another run) or a new episode at the rollout's first
    step (the envs were reset in between), a decision still waiting is never linked."""
    buffer = ReplayBuffer(turn_info(2, 2), 2 * 20)
    buffer.add(steps_of([[True, False, False], [False, True, False]]))
    assert buffer.turns.open.tolist() == [0, 20 + 1]
    if how == "unlink":
        buffer.unlink()
    buffer.add(steps_of([[True, False, False], [False, True, False]], first=how == "first"))
    assert not bool(buffer.sampleable[0, 0]) and not bool(buffer.sampleable[1, 1])
    assert buffer.storage["reward"][1, 1].item() == 1.0, "the steps after the break were not folded in"


def test_env_copies_that_disagree_on_taking_turns_are_refused():
    made = []

    def make():
        env = TurnsEnv()
        env.turn_based = bool(made)  # copy 0 says nothing, copy 1 says its agents take turns
        made.append(env)
        return env

    with pytest.raises(shoal.EnvError, match=r"copy 1 has 2 agents \['x', 'o'\], taking turns with .* copy 0 has 2"):
        make_backend(make, 2)


def test_a_decision_whose_column_is_written_over_while_it_waits_is_dropped():
    """An agent that waits longer than the buffer is long: its decision's column holds newer
    steps by the time it moves again, so the decision is dropped, not linked across the wrap."""
    info = turn_info(2, 2)
    buffer = ReplayBuffer(info, 2 * 8)
    # player 0 moves at every step, player 1 has a single turn: step 0
    rollout = steps_of([[True] * 21, [True] + [False] * 20])
    for start in range(0, 20, 5):
        buffer.add(rollout[:, start : start + 6].clone())
    assert int(buffer.turns.open[1]) == -1, "player 1's decision was written over and dropped"
    rollout["valid"][1, :] = True
    buffer.add(rollout[:, 14:16].clone())
    assert bool(buffer.sampleable[0].any()) and not bool(buffer.storage["reward"][1].gt(1).any())
