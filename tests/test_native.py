"""Native many-agent envs (shoal.AgentEnv): rows written in place, own autoreset, workers, learning, errors."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_pettingzoo import tracked

import shoal
from shoal.envs.examples import TargetGrid
from shoal.vector import make_backend


class Clock(shoal.AgentEnv):
    """Agent k sees [k, age] (steps into its own episode) and earns k + 1 a step; its episode lasts
    k + 1 steps and ends terminated for even k, truncated for odd k. Agents restart on their own.
    With ``masks``, agent k may take actions 0..k of Discrete(3)."""

    def __init__(self, masks: bool = False):
        self.num_agents = 3
        self.single_observation_space = gym.spaces.Box(0.0, 9.0, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self.action_masks = masks
        self.slot = np.arange(3)
        self.age = np.zeros(3, np.int64)
        self.actions = []

    def reset(self, seed):
        self.age[:] = 0
        self.obs[:, 0] = self.slot
        self.obs[:, 1] = 0
        self.terminated[:] = False
        self.truncated[:] = False
        if self.action_masks:
            self.action_mask[:] = np.arange(3) <= self.slot[:, None]

    def step(self, actions):
        self.actions.append(actions.copy())
        self.age += 1
        self.reward[:] = self.slot + 1
        done = self.age == self.slot + 1
        np.logical_and(done, self.slot % 2 == 0, out=self.terminated)
        np.logical_and(done, self.slot % 2 == 1, out=self.truncated)
        self.obs[:, 1] = self.age
        self.final_obs[self.truncated] = self.obs[self.truncated]
        self.age[done] = 0
        self.obs[:, 1] = self.age
        for slot in np.flatnonzero(done):
            self.final_infos[int(slot)] = {"age": int(slot) + 1}


def test_rows_are_written_in_place_and_agents_restart_on_their_own():
    backend = make_backend(Clock, 2)
    assert backend.num_rows == 6 and backend.rows_per_env == 3 and backend.agents is None
    env = backend.envs[1]
    assert np.shares_memory(env.obs, backend.batch.obs.numpy()) and env.obs.base is not None
    backend.reset(0)
    seen = []
    for t in range(3):
        backend.send(torch.arange(6) + t)
        b = backend.recv()
        seen.append((b.obs[:3, 1].tolist(), b.terminated[:3].tolist(), b.truncated[:3].tolist(), b.reward[:3].tolist()))
        if t == 1:
            assert b.final_obs[1].tolist() == [1.0, 2.0]  # agent 1's true last observation
            assert backend.final_infos == {0: {"age": 1}, 1: {"age": 2}, 3: {"age": 1}, 4: {"age": 2}}
    assert seen == [
        ([0.0, 1.0, 1.0], [True, False, False], [False, False, False], [1.0, 2.0, 3.0]),
        ([0.0, 0.0, 2.0], [True, False, False], [False, True, False], [1.0, 2.0, 3.0]),
        ([0.0, 1.0, 0.0], [True, False, True], [False, False, False], [1.0, 2.0, 3.0]),
    ]
    assert [a.tolist() for a in env.actions] == [[3, 4, 5], [4, 5, 6], [5, 6, 7]]  # each env gets its rows
    assert backend.final_infos == {0: {"age": 1}, 2: {"age": 3}, 3: {"age": 1}, 5: {"age": 3}}


def test_each_agents_episode_counts_as_an_episode():
    tracker = tracked(make_backend(Clock, 2), 6)
    # In 6 steps agent 0 ends 6 episodes of return 1, agent 1 three of 4, agent 2 two of 9; per env.
    assert tracker.episodes_total == 2 * 11
    assert tracker.summarize()["episode_reward_mean"] == pytest.approx((6 * 1 + 3 * 4 + 2 * 9) / 11)


def test_the_env_writes_its_action_masks():
    backend = make_backend(lambda: Clock(masks=True), 2)
    backend.reset(0)
    assert backend.batch.action_mask[:3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


class Relay(shoal.AgentEnv):
    """Three agents move in turn; agent 1 leaves on its own move (the second) and the game ends
    after the sixth, which the env says in ``env_done`` (and leaves it to the backend to clear)."""

    turn_based = True

    def __init__(self):
        self.num_agents = 3
        self.single_observation_space = gym.spaces.Box(0.0, 9.0, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.order = [0, 1, 2, 0, 2, 0]

    def reset(self, seed):
        self.moves = 0
        self.terminated[:] = self.truncated[:] = False
        self.valid[:] = True
        self.obs[:] = 0

    def step(self, actions):
        self.valid[:] = False
        self.valid[self.order[self.moves]] = True
        self.terminated[:] = self.truncated[:] = False
        self.terminated[1] = self.moves == 1
        self.moves += 1
        if self.moves == len(self.order):
            self.env_done[:] = True
            self.truncated[[0, 2]] = True
            self.final_obs[:] = self.moves
            self.moves = 0
        self.obs[:] = self.moves


def test_a_native_turn_based_env_says_where_its_game_ends():
    from shoal.collect.episodes import mark_episode_starts

    assert make_backend(Clock, 1).batch.env_done is None  # only an env that takes turns has the rows
    backend = make_backend(Relay, 2)
    assert np.shares_memory(backend.envs[1].env_done, backend.batch.env_done.numpy())
    backend.reset(0)
    first = torch.zeros(6, dtype=torch.bool)
    starts = []
    for _ in range(6):
        backend.send(torch.zeros(6, dtype=torch.long))
        b = backend.recv()
        mark_episode_starts(b.terminated | b.truncated, b.valid, "same_step", 3, first, b.env_done)
        starts.append(first.tolist())
    # agent 1 leaving on the second move starts nothing: the others wait for their turns
    assert starts == [[False] * 6] * 5 + [[True] * 6]


@pytest.mark.slow
def test_worker_processes_clear_a_native_envs_game_ends_as_in_process():
    serial, workers = make_backend(Relay, 4), make_backend(Relay, 4, num_workers=2)
    try:
        serial.reset(0)
        workers.reset(0)
        serial.recv()
        workers.recv()
        actions = torch.zeros(12, dtype=torch.long)
        for step in range(14):  # over two games
            serial.send(actions)
            workers.send(actions)
            a, b = serial.recv(), workers.recv()
            assert a.env_done.tolist() == [step % 6 == 5] * 12, step
            assert torch.equal(a.env_done, b.env_done) and torch.equal(a.valid, b.valid), step
    finally:
        workers.close()


def test_complete_episode_rollouts_of_a_native_turn_based_env_hold_whole_games():
    with shoal.PPO(
        env=lambda config: Relay(),
        env_config={"max_episode_steps": 6},  # the most turns a game takes
        batch_mode="complete_episodes",
        num_envs=2,
        rollout_fragment_length=7,  # the first end after 7 steps is the second game's
        sgd_minibatch_size=8,
        save_outputs=False,
        verbose=0,
    ) as trainer:
        for _ in range(3):
            assert trainer.train()["timesteps_this_iter"] == 2 * 12
            rollout = trainer.algorithm.buffer.rollout[:, :-1]
            for env in range(2):
                acted = rollout["valid"].view(2, 3, -1)[env].any(0).nonzero().squeeze(1)
                ends = rollout["env_done"].view(2, 3, -1)[env].all(0).nonzero().squeeze(1)
                assert len(acted) == 12 and torch.equal(ends, acted[5::6])


@pytest.mark.slow
def test_worker_processes_give_the_same_rows():
    serial = make_backend(lambda: TargetGrid(max_steps=5), 4)
    workers = make_backend(lambda: TargetGrid(max_steps=5), 4, num_workers=2)
    try:
        gen = torch.Generator().manual_seed(0)
        serial.reset(7)
        workers.reset(7)
        a, b = serial.recv(), workers.recv()
        for step in range(11):
            if step:
                actions = torch.randint(0, 5, (serial.num_rows,), generator=gen)
                serial.send(actions)
                workers.send(actions)
                a, b = serial.recv(), workers.recv()
            for field in ("obs", "reward", "terminated", "truncated", "valid", "final_obs"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (step, field)
        assert a.truncated.all() and not torch.equal(a.obs, a.final_obs)  # step 10 ended every episode
    finally:
        workers.close()


def test_an_instance_keeps_its_training_rows_when_evaluated_and_each_agent_is_an_evaluation_episode():
    with shoal.PPO(
        env=TargetGrid(num_agents=8), num_envs=1, sgd_minibatch_size=64, save_outputs=False, verbose=0
    ) as algo:
        env = algo.backend.envs[0]
        out = algo.evaluate(2)
        assert np.shares_memory(env.obs, algo.backend.batch.obs.numpy())
    assert out["episodes"] == 2 * 8 and out["episode_len_mean"] == 32.0
    assert out["episode_reward_max"] < 20  # one agent's return: 32 steps reach at most ~16 targets


@pytest.mark.slow
def test_ppo_learns_target_grid():
    # 4 envs x 128 agents; an iteration is 32 steps, one episode of every agent.
    with shoal.PPO(
        env=TargetGrid, num_envs=4, sgd_minibatch_size=2048, num_sgd_iter=4, save_outputs=False, verbose=0, seed=0
    ) as algo:
        first = algo.train()
        for _ in range(9):
            result = algo.train()
    assert first["episodes_this_iter"] == 512
    # An agent's return: 1 per target reached plus 0.1 per cell of progress; random moves earn
    # about 0.3, walking straight to each target about 9.
    assert first["episode_reward_mean"] < 1.0
    assert result["episode_reward_mean"] > 6.0


class Replaces(Clock):
    def step(self, actions):
        self.reward = np.ones(3, np.float32)


def odd(**attrs) -> Clock:
    """A Clock with ``attrs`` set over its own declarations."""
    env = Clock()
    env.__dict__.update(attrs)
    return env


@pytest.mark.parametrize(
    "attrs, message",
    [
        (dict(num_agents=0), r"native env 'Clock' has num_agents=0; it must be a positive int"),
        (
            dict(single_observation_space=gym.spaces.Discrete(4)),
            r"single_observation_space Discrete\(4\).*must be a Box",
        ),
        (
            dict(single_action_space=gym.spaces.Box(-1, 1, (2,)), action_masks=True),
            r"action_masks=True with single_action_space Box.*need a Discrete action space",
        ),
        (dict(single_action_space=gym.spaces.Text(3)), r"action space Text.* is not supported"),
    ],
)
def test_bad_declarations_are_named(attrs, message):
    with pytest.raises(shoal.EnvError, match=message):
        make_backend(lambda: odd(**attrs), 1)


def test_replacing_a_row_array_is_refused_and_named():
    backend = make_backend(Replaces, 1)
    backend.reset(0)
    with pytest.raises(
        shoal.EnvError,
        match=r"self.reward is this env's rows of the flat batch \(\[3\] float32\) "
        r"and cannot be replaced; write into it instead",
    ):
        backend.send(torch.zeros(3, dtype=torch.long))
    with pytest.raises(shoal.EnvError, match=r"no 'obs' rows yet: they come from bind\(rows\)"):
        Clock().reset(0)


def test_copies_must_have_the_same_agents_and_spaces():
    sizes = iter([3, 2])
    with pytest.raises(shoal.EnvError, match=r"copy 1 has 2 agents None .* copy 0 has 3 agents None"):
        make_backend(lambda: odd(num_agents=next(sizes)), 2)
