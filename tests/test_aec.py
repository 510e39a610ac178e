"""PettingZoo AEC (turn-based) envs as agent rows: one mover per step, rewards on every row, the
dead stepped out with None, same-step reset; connect four self-play against a random player."""

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import AECEnv
from pettingzoo.test import api_test

import shoal
from shoal.algos.off_policy import transitions
from shoal.algos.returns import gae
from shoal.envs.aec import AECEnvAdapter
from shoal.envs.pettingzoo import ParallelEnvAdapter
from shoal.envs.registry import is_aec_env, is_parallel_env
from shoal.vector import make_backend

with warnings.catch_warnings():  # importing a PettingZoo env module directly warns that it is deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from pettingzoo.classic import connect_four_v3

CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class TurnsEnv(AECEnv):
    """Agents a0, a1, a2 move in turn. A move by agent k with action x pays the mover x + 1 and
    every other agent still in the game 10 * (k + 1). a1 dies (terminated) on move ``death_move``:
    by default the third, which is a2's (the second is a1's own); the others are truncated after
    ``max_moves`` moves. obs = [k, moves]; a2 has a larger Discrete. Dead agents are selected at
    once (``_deads_step_first``), as PettingZoo's own envs do."""

    metadata = {"name": "turns_v0", "is_parallelizable": False, "render_modes": []}

    def __init__(self, max_moves: int = 6, death_move: int = 3):
        super().__init__()
        self.possible_agents = ["a0", "a1", "a2"]
        self.max_moves, self.death_move = max_moves, death_move

    @functools.cache
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 100.0, (2,), np.float32)

    @functools.cache
    def action_space(self, agent):
        return gym.spaces.Discrete(3 if agent == "a2" else 2)

    def observe(self, agent):
        return np.array([self.possible_agents.index(agent), self.moves], np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.moves = 0
        self.agent_selection = "a0"

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        k = self.possible_agents.index(agent)
        self.moves += 1
        self.rewards = {a: float(action + 1) if a == agent else 10.0 * (k + 1) for a in self.agents}
        if self.moves == self.death_move:
            self.terminations["a1"] = True
            self.infos["a1"] = {"moves": self.moves}
        if self.moves >= self.max_moves:
            self.truncations = dict.fromkeys(self.agents, True)
        live = [a for a in self.agents if not (self.terminations[a] or self.truncations[a])]
        following = self.agents[self.agents.index(agent) + 1 :] + self.agents
        self.agent_selection = next((a for a in following if a in live), agent)
        self._accumulate_rewards()
        self._deads_step_first()


@pytest.mark.parametrize("make", [TurnsEnv, connect_four_v3.env])
def test_the_envs_the_adapter_is_tested_with_pass_pettingzoos_own_api_test(make):
    api_test(make(), num_cycles=100)


def test_aec_envs_are_told_from_parallel_ones_and_get_the_turn_based_adapter():
    aec, parallel = connect_four_v3.env(), __import__("mpe2.simple_spread_v3").simple_spread_v3.parallel_env()
    assert is_aec_env(aec) and not is_parallel_env(aec)
    assert is_parallel_env(parallel) and not is_aec_env(parallel)
    for env in (CONNECT_FOUR, aec, connect_four_v3.env, lambda: TurnsEnv()):
        backend = make_backend(env, 2)
        assert type(backend.envs[0]) is AECEnvAdapter and backend.turn_based, env
    # A module with both APIs is stepped through the Parallel one: every agent acts each step.
    parallel_backend = make_backend("pettingzoo:mpe2.simple_spread_v3", 1)
    assert type(parallel_backend.envs[0]) is ParallelEnvAdapter and not parallel_backend.turn_based


def _step(backend, actions):
    backend.send(torch.as_tensor(actions))
    return backend.recv()


def _record(backend, actions, fields):
    """Copies of ``fields`` of the batch after one step (the batch itself is overwritten by the next)."""
    batch = _step(backend, actions)
    return [getattr(batch, f).clone() for f in fields]


def test_only_the_mover_acts_every_agent_gets_its_rewards_and_dead_agents_become_padding():
    backend = make_backend(lambda: TurnsEnv(), 1)
    assert backend.num_rows == 3 and backend.agents == ["a0", "a1", "a2"]
    backend.reset(0)
    batch = backend.recv()
    assert batch.obs.tolist() == [[0, 0], [1, 0], [2, 0]]
    # a0 and a1 have Discrete(2) inside the Discrete(3) layout: their extra action is masked.
    assert batch.action_mask.tolist() == [[True, True, False]] * 2 + [[True] * 3]
    seen = []
    for t in range(7):
        # Each row sends its own action; only the mover's is played (the mover earns it + 1).
        batch = _step(backend, [1, 0, 2])
        seen.append(
            (
                batch.valid.tolist(),
                batch.reward.tolist(),
                batch.terminated.tolist(),
                batch.truncated.tolist(),
                batch.obs[:, 1].tolist(),
            )
        )
        assert batch.env_done.tolist() == [t == 5] * 3  # the game ends on every row at once, not where a1 dies
        if t == 2:
            assert backend.final_infos == {1: {"moves": 3}}
        if t == 5:
            assert batch.final_obs[[0, 2]].tolist() == [[0, 6], [2, 6]]  # truncated: the true last obs
            assert backend.final_infos == {}
    F, T = False, True
    assert seen == [
        ([T, F, F], [2.0, 10.0, 10.0], [F, F, F], [F, F, F], [1, 1, 1]),  # a0 moves; the others get 10
        ([F, T, F], [20.0, 1.0, 20.0], [F, F, F], [F, F, F], [2, 2, 2]),
        ([F, F, T], [30.0, 30.0, 3.0], [F, T, F], [F, F, F], [3, 0, 3]),  # a2's move kills a1: padding from now
        ([T, F, F], [2.0, 0.0, 10.0], [F, F, F], [F, F, F], [4, 0, 4]),  # a1 was stepped out with None
        ([F, F, T], [30.0, 0.0, 3.0], [F, F, F], [F, F, F], [5, 0, 5]),
        ([T, F, F], [2.0, 0.0, 10.0], [F, F, F], [T, F, T], [0, 0, 0]),  # all truncated: a new game at once
        ([T, F, F], [2.0, 10.0, 10.0], [F, F, F], [F, F, F], [1, 1, 1]),
    ]
    assert batch.obs[:, 0].tolist() == [0, 1, 2]


def test_an_agent_leaving_on_its_own_move_does_not_end_the_game_for_the_others():
    """a1 dies on its own move (the second) while a0 and a2 wait: neither the flags of that step
    nor anything built on them may take it for the game's end. a0's first decision still
    bootstraps from a0's next one, the policies stay mapped, and a game counts as one episode."""
    mapped = []

    def mapping(agent, episode):
        mapped.append(agent)
        return "dying" if agent == "a1" else "staying"

    algo = shoal.DQN(
        env=lambda: TurnsEnv(max_moves=6, death_move=2),
        policies=["staying", "dying"],
        policy_mapping_fn=mapping,
        num_envs=1,
        learning_starts=10**9,
        timesteps_per_iteration=6 * 40,
        rollout_fragment_length=6 * 40 + 2,  # a game is 6 steps: 40 games, and a0 and a1 move in a 41st
        save_outputs=False,
        verbose=0,
        seed=0,
    )
    with algo:
        result = algo.train()
        replay = algo.algorithm.replay
        index = replay.sampleable.view(-1).nonzero().squeeze(1)
        batch = transitions(replay, index, n_step=1, gamma=0.99)
    assert result["timesteps_this_iter"] == 6 * 40 + 2
    assert result["episodes_this_iter"] == 40
    assert len(mapped) == 3 * 41  # at the start, and once per game after it
    opening = (batch["obs"] == torch.tensor([0.0, 0.0])).all(1)  # a0's first move of a game
    assert int(opening.sum()) == 40  # the 41st waits for a0's next move
    assert (batch["next_obs"][opening] == torch.tensor([0.0, 3.0])).all()  # a0's, after a1 died and a2 moved
    assert (batch["discount"][opening] > 0).all()
    # a0 moves 3 times a game, a1 once, a2 twice: every decision of a finished game is drawable
    agents = batch["obs"][:, 0]
    assert [int((agents == k).sum()) for k in range(3)] == [3 * 40, 41, 2 * 40]


def test_evaluation_starts_no_episode_where_an_agent_leaves_on_its_own_move():
    from shoal.train.evaluation import run_episodes

    seen = []

    def act(obs, mask, first):  # a recurrent policy resets its rows' state where ``first`` is set
        seen.append(first.tolist())
        return torch.zeros(3, dtype=torch.long)

    run_episodes(make_backend(lambda: TurnsEnv(max_moves=6, death_move=2), 1), act, seed=0)
    assert seen == [[True] * 3] + [[False] * 3] * 5  # six moves, the game's first one alone starting it


def _board(*cells):
    """A connect-four observation plane [6, 7] with a 1 at each (row, column)."""
    plane = np.zeros((6, 7), np.int8)
    for r, c in cells:
        plane[r, c] = 1
    return plane


def test_a_connect_four_game_row_by_row():
    """player_0 stacks column 0 and wins on its fourth move; player_1 plays column 1."""
    backend = make_backend(CONNECT_FOUR, 2)
    env = backend.envs[0].env
    backend.reset(0)
    moves = [0, 1, 0, 1, 0, 1, 0]
    for t, column in enumerate(moves):
        other = 6 if t < 6 else 5  # env 1 fills column 6, both sides in turn
        batch = _step(backend, [column, column, other, other])
        mover = t % 2
        if t < len(moves) - 1:
            assert batch.valid[:2].tolist() == [mover == 0, mover == 1]
            assert batch.reward[:2].tolist() == [0.0, 0.0] and not batch.terminated[:2].any()
            for slot, agent in enumerate(env.possible_agents):  # each row holds what its agent observes
                seen = env.observe(agent)
                assert np.array_equal(batch.obs[slot].numpy(), seen["observation"])
                assert batch.action_mask[slot].tolist() == seen["action_mask"].astype(bool).tolist()
            # The next mover may play any column; the other row's mask is empty (treated as unmasked).
            assert batch.action_mask[1 - mover].all() and not batch.action_mask[mover].any()
    assert batch.valid[:2].tolist() == [True, False]
    assert batch.reward[:2].tolist() == [1.0, -1.0]  # the loser's -1 lands on the winner's move
    assert batch.terminated[:2].tolist() == [True, True] and not batch.truncated.any()
    # Same-step reset: both rows already show the new game's empty board.
    assert not batch.obs[:2].any() and batch.action_mask[0].all() and not batch.action_mask[1].any()
    # Env 1 filled column 6 with alternating pieces: no four, and column 6 is closed to player_1.
    assert batch.reward[2:].tolist() == [0.0, 0.0] and not batch.terminated[2:].any()
    assert batch.action_mask[3].tolist() == [True] * 6 + [False]


def test_an_illegal_move_ends_the_game_as_pettingzoos_wrapper_rules():
    """connect_four_v3.env() ends the game when the mover ignores its mask: the mover gets -1 and
    every agent is both terminated and truncated, which shoal reports as terminated."""
    backend = make_backend(CONNECT_FOUR, 1)
    backend.reset(0)
    for _ in range(6):  # fill column 0
        _step(backend, [0, 0])
    batch = _step(backend, [0, 0])
    assert batch.valid.tolist() == [True, False] and batch.reward.tolist() == [-1.0, 0.0]
    assert batch.terminated.tolist() == [True, True] and not batch.truncated.any()
    assert not batch.obs.any()  # a new game


def test_observations_are_from_each_agents_side():
    backend = make_backend(CONNECT_FOUR, 1)
    backend.reset(0)
    batch = _step(backend, [3, 5])  # player_0 drops in column 3
    assert np.array_equal(batch.obs[0, :, :, 0].numpy(), _board((5, 3)))  # its own piece
    assert np.array_equal(batch.obs[1, :, :, 1].numpy(), _board((5, 3)))  # player_1 sees an opponent's
    assert not batch.obs[0, :, :, 1].any() and not batch.obs[1, :, :, 0].any()


def _random_legal(mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A uniform legal action per row; rows with no legal action (not their turn) pick any."""
    allowed = mask | ~mask.any(1, keepdim=True)
    return torch.multinomial(allowed.float(), 1, generator=gen).squeeze(1)


@pytest.mark.parametrize("env", [CONNECT_FOUR, lambda: TurnsEnv(max_moves=5)])
@pytest.mark.slow
def test_worker_processes_give_the_same_turn_based_batches(env):
    serial, mp = make_backend(env, 4), make_backend(env, 4, num_workers=2)
    assert mp.turn_based  # the row layout the workers' envs were probed for says so
    gen = torch.Generator().manual_seed(0)
    ended = 0
    try:
        serial.reset(1)
        mp.reset(1)
        for step in range(80):
            a, b = serial.recv(), mp.recv()
            for field in ("obs", "reward", "terminated", "truncated", "valid", "final_obs", "action_mask", "env_done"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (step, field)
            assert serial.final_infos == mp.final_infos
            ended += int(a.terminated.sum() + a.truncated.sum())
            actions = _random_legal(a.action_mask, gen)
            serial.send(actions)
            mp.send(actions)
    finally:
        mp.close()
    assert ended >= 8  # games ended (and envs reset) along the way


def test_gae_folds_the_losers_reward_into_its_last_decision():
    """The scripted connect-four game again, through GAE: player_1's -1 arrives on player_0's
    winning move, a step where player_1 did not act, and must reach player_1's last decision."""
    backend = make_backend(CONNECT_FOUR, 1)
    backend.reset(0)
    fields = ("reward", "terminated", "truncated", "valid")
    steps = [_record(backend, [column, column], fields) for column in [0, 1, 0, 1, 0, 1, 0]]
    reward, terminated, truncated, valid = (torch.stack(column, 1) for column in zip(*steps))
    value = torch.full((2, 8), 0.5)
    advantage = gae(reward, value, terminated, truncated, torch.zeros(2, 7), gamma=0.9, gae_lambda=0.95, valid_t=valid)
    assert valid.tolist() == [[True, False] * 3 + [True], [False, True] * 3 + [False]]
    # Folded rewards are not discounted and the game ended: the last decisions see -1 and +1 minus V = 0.5.
    assert advantage[1, 5].item() == pytest.approx(-1.5)
    assert advantage[0, 6].item() == pytest.approx(0.5)
    assert not advantage[~valid].any()


def test_bad_turn_based_envs_are_named_in_the_error():
    class Mixed(TurnsEnv):
        def action_space(self, agent):
            return gym.spaces.Box(-1, 1, (2,)) if agent == "a2" else gym.spaces.Discrete(2)

    class Undying(TurnsEnv):
        def _was_dead_step(self, action):  # forgets to remove the dead agent
            pass

    with pytest.raises(shoal.EnvError, match="action spaces differ.*a2: Box"):
        make_backend(lambda: Mixed(), 1)
    backend = make_backend(lambda: Undying(), 1)
    backend.reset(0)
    with pytest.raises(shoal.EnvError, match="dead agent 'a1' with None did not remove it"):
        for _ in range(3):
            _step(backend, [0, 0, 0])
    with pytest.raises(shoal.EnvError, match="cannot import PettingZoo env module 'pettingzoo.classic.no_such_v0'"):
        make_backend("pettingzoo:pettingzoo.classic.no_such_v0", 1)
    with pytest.raises(shoal.EnvError, match="module 'pettingzoo.utils' has neither a parallel_env.. nor an env"):
        make_backend("pettingzoo:pettingzoo.utils", 1)
    with pytest.raises(
        shoal.EnvError,
        match="returned int, expected a gymnasium.Env .*, a PettingZoo ParallelEnv or AECEnv, or a shoal.AgentEnv",
    ):
        make_backend(lambda: 42, 1)


@pytest.mark.slow
def test_self_play_learns_to_beat_a_random_player_without_an_illegal_move():
    """The shipped config, briefly: one shared policy plays both sides, then 100 games against a
    uniform random legal-move player (an untrained argmax policy stacks one column and already
    wins about 55-85% of them, depending on its initial weights)."""
    from benchmarks.connect_four import CONFIG, play_vs_random
    from shoal.config import load_yaml

    with shoal.PPO(**{**load_yaml(CONFIG), "seed": 0, "save_outputs": False, "verbose": 0}) as algo:
        untrained = play_vs_random(algo, 100, seed=0)
        algo.learn(49_152)  # 6 iterations, about 15 s
        trained = play_vs_random(algo, 100, seed=0)  # raises on an illegal move
    assert untrained["win_rate"] < 0.7
    assert trained["win_rate"] >= 0.8, trained
    assert trained["win_first"] >= 0.7 and trained["win_second"] >= 0.7, trained


def test_a_policy_picking_an_illegal_move_is_caught():
    from benchmarks.connect_four import IllegalMoveError, play_vs_random

    class AlwaysColumnZero:  # ignores the mask: column 0 is full after six moves
        def get_policy(self):
            return self

        def initial_state(self, rows):
            return None

        def act(self, obs, state, first, action_mask, deterministic=False):
            return torch.zeros(1, dtype=torch.long), None, state

    with pytest.raises(IllegalMoveError, match="chose column 0; legal columns were"):
        play_vs_random(AlwaysColumnZero(), 20, seed=0)


def test_evaluation_ends_turn_based_games_and_counts_the_losers_reward():
    with shoal.PPO(
        env="pettingzoo:pettingzoo.classic.connect_four_v3",
        policies=["main", "other"],
        policy_mapping_fn=lambda agent, episode: "main" if agent == "player_0" else "other",
        num_envs=4,
        sgd_minibatch_size=64,
        save_outputs=False,
        verbose=0,
    ) as algo:
        out = algo.evaluate(6)
    assert out["episodes"] == 6
    assert out["episode_reward_mean"] == 0.0  # zero-sum: the waiting loser's -1 is counted with the winner's +1
    wins = out["policy_reward_mean"]
    assert set(wins) == {"main", "other"} and wins["main"] == -wins["other"]
