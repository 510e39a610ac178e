"""PettingZoo Parallel envs as agent rows: padding for absent agents, mixed spaces, autoreset."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

import shoal
from shoal.vector import make_backend
from tests.conftest import SHORT_TEAM_RUN


class DyingAgentsEnv(ParallelEnv):
    """Three agents; agent k terminates after k+1 steps, so rows leave one by one. obs = [k, t]
    for agent k (agent 2 sees a wider obs), reward = k + 1 per step. Agent 2's Discrete is larger.
    With ``cut``, every agent is truncated after ``cut`` steps instead."""

    metadata = {"name": "dying_agents_v0"}

    def __init__(self, cut: int | None = None):
        self.possible_agents = ["a0", "a1", "a2"]
        self.cut = cut

    @functools.cache
    def observation_space(self, agent):
        return gym.spaces.Box(-np.inf, np.inf, (3 if agent == "a2" else 2,), np.float32)

    @functools.cache
    def action_space(self, agent):
        return gym.spaces.Discrete(4 if agent == "a2" else 2)

    def _obs(self, agent):
        k = self.possible_agents.index(agent)
        return np.full(self.observation_space(agent).shape, 0.0, np.float32) + np.array(
            [k, self.t] + ([7.0] if k == 2 else []), np.float32
        )

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: float(self.possible_agents.index(a) + 1) for a in self.agents}
        if self.cut is None:
            term = {a: self.t >= self.possible_agents.index(a) + 1 for a in self.agents}
            trunc = dict.fromkeys(self.agents, False)
        else:
            term = dict.fromkeys(self.agents, False)
            trunc = dict.fromkeys(self.agents, self.t >= self.cut)
        infos = {a: ({"steps": self.t} if term[a] or trunc[a] else {}) for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, infos


@pytest.mark.parametrize(
    "make",
    [
        DyingAgentsEnv,
        lambda: DyingAgentsEnv(cut=2),
        lambda: __import__("mpe2.simple_spread_v3").simple_spread_v3.parallel_env(),
    ],
)
def test_the_envs_the_adapter_is_tested_with_pass_pettingzoos_own_api_test(make):
    parallel_api_test(make(), num_cycles=50)


def test_agents_leaving_mid_episode_become_padding_rows_and_the_env_resets_when_all_are_gone():
    backend = make_backend(lambda: DyingAgentsEnv(), 2)
    assert backend.num_rows == 6 and backend.rows_per_env == 3
    assert backend.obs_spec.shape == (3,)  # the widest agent's obs; narrower ones are zero-padded
    backend.reset(0)
    batch = backend.recv()
    assert batch.obs[:3].tolist() == [[0, 0, 0], [1, 0, 0], [2, 0, 7]]
    assert batch.agent_id.tolist() == [0, 1, 2, 0, 1, 2] and batch.env_id.tolist() == [0, 0, 0, 1, 1, 1]
    # Agents a0/a1 have Discrete(2) inside the Discrete(4) layout: their extra actions are masked.
    assert batch.action_mask[:3].tolist() == [[True, True, False, False]] * 2 + [[True] * 4]
    seen = []
    for _ in range(4):
        backend.send(torch.zeros(6, dtype=torch.long))
        batch = backend.recv()
        seen.append((batch.valid[:3].tolist(), batch.terminated[:3].tolist(), batch.reward[:3].tolist()))
    assert seen == [
        ([True, True, True], [True, False, False], [1.0, 2.0, 3.0]),  # a0 leaves after step 1
        ([False, True, True], [False, True, False], [0.0, 2.0, 3.0]),  # its row is padding now
        ([False, False, True], [False, False, True], [0.0, 0.0, 3.0]),  # a2 leaves last: the env resets
        ([True, True, True], [True, False, False], [1.0, 2.0, 3.0]),  # a new episode
    ]
    assert backend.final_infos == {0: {"steps": 1}, 3: {"steps": 1}}


def test_truncated_agents_keep_their_last_observation_for_bootstrapping():
    backend = make_backend(lambda: DyingAgentsEnv(cut=2), 1)
    backend.reset(0)
    for _ in range(2):
        backend.send(torch.zeros(3, dtype=torch.long))
    batch = backend.recv()
    assert batch.truncated.tolist() == [True] * 3 and not batch.terminated.any()
    assert batch.final_obs.tolist() == [[0, 2, 0], [1, 2, 0], [2, 2, 7]]
    assert batch.obs[:, 1].tolist() == [0, 0, 0]  # already reset


@pytest.mark.slow
def test_worker_processes_give_the_same_multi_agent_batch():
    serial, mp = make_backend(lambda: DyingAgentsEnv(), 4), make_backend(lambda: DyingAgentsEnv(), 4, num_workers=2)
    try:
        serial.reset(1)
        mp.reset(1)
        for step in range(7):
            a, b = serial.recv(), mp.recv()
            for field in ("obs", "reward", "terminated", "truncated", "valid", "action_mask"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (step, field)
            assert serial.final_infos == mp.final_infos
            actions = torch.randint(0, 2, (12,))
            serial.send(actions)
            mp.send(actions)
    finally:
        mp.close()


def test_bad_multi_agent_envs_are_named_in_the_error():
    class Mixed(DyingAgentsEnv):
        def action_space(self, agent):
            return gym.spaces.Box(-1, 1, (2,)) if agent == "a2" else gym.spaces.Discrete(2)

    with pytest.raises(shoal.EnvError, match="action spaces differ.*a2: Box"):
        make_backend(lambda: Mixed(), 1)
    with pytest.raises(shoal.EnvError, match="cannot import PettingZoo env module 'mpe2.no_such_v0'"):
        make_backend("pettingzoo:mpe2.no_such_v0", 1)


def tracked(backend, steps: int):
    """An EpisodeTracker fed ``steps`` steps of ``backend`` (reset with seed 0), every action 0."""
    from shoal.collect import EpisodeTracker

    n = backend.num_rows
    tracker = EpisodeTracker(n, 100, backend.batch.env_id.numpy(), agent_names=backend.agents)
    backend.reset(0)
    reward, done, valid = (np.zeros((steps, n), dtype) for dtype in (np.float32, bool, bool))
    for t in range(steps):
        backend.send(torch.zeros(n, dtype=torch.long))
        batch = backend.recv()
        reward[t], done[t], valid[t] = batch.reward, batch.terminated | batch.truncated, batch.valid
    tracker.add(reward, done, valid)
    return tracker


def test_team_return_sums_the_agents_and_each_agent_has_its_own():
    tracker = tracked(make_backend(lambda: DyingAgentsEnv(), 2), 7)
    out = tracker.summarize()
    # Agent k lives k+1 steps earning k+1 per step: returns 1, 4, 9; the team's episode is 14 over 3 steps.
    assert out["agent_reward_mean"] == {"a0": 1.0, "a1": 4.0, "a2": 9.0}
    assert out["episode_reward_mean"] == 14.0 and out["episode_len_mean"] == 3.0
    # Per env, 7 steps hold a0's episodes 3 times and a1's and a2's twice: (3*1 + 2*4 + 2*9) / 7.
    assert out["policy_reward_mean"] == {"default_policy": pytest.approx(29 / 7)}
    assert tracker.episodes_total == 2 * 2  # the teams' episodes: 2 envs x 2


class GuessEnv(ParallelEnv):
    """Each agent is shown a target as a one-hot and earns 1 for choosing it. "short" has 2
    choices and leaves after 3 steps; "long" has 3 choices and a wider obs, and plays 5 steps."""

    metadata = {"name": "guess_v0"}
    sizes = {"short": 2, "long": 3}

    def __init__(self):
        self.possible_agents = ["short", "long"]

    @functools.cache
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (self.sizes[agent],), np.float32)

    @functools.cache
    def action_space(self, agent):
        return gym.spaces.Discrete(self.sizes[agent])

    def _observe(self):
        self.target = {a: int(self.rng.integers(self.sizes[a])) for a in self.agents}
        return {a: np.eye(self.sizes[a], dtype=np.float32)[self.target[a]] for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(actions[a] == self.target[a]) for a in self.agents}
        term = {a: self.t >= (3 if a == "short" else 5) for a in self.agents}
        trunc = dict.fromkeys(self.agents, False)
        self.agents = [a for a in self.agents if not term[a]]
        obs = self._observe()
        obs.update({a: np.zeros(self.sizes[a], np.float32) for a in term if term[a]})
        return obs, rewards, term, trunc, {a: {} for a in term}


@pytest.mark.slow
def test_ppo_learns_a_multi_agent_env_with_mixed_spaces_and_agents_leaving():
    parallel_api_test(GuessEnv(), num_cycles=20)
    with shoal.PPO(
        env=lambda: GuessEnv(),
        **SHORT_TEAM_RUN,
    ) as algo:
        first = algo.train()
        algo.learn(8_000)
        result = algo.train()
    # Team maximum 3 + 5 = 8; choosing at random earns about 3 * 1/2 + 5 * 1/3 = 3.2.
    assert first["episode_reward_mean"] < 4.5
    assert result["episode_reward_mean"] > 7.0
    assert result["agent_reward_mean"]["short"] > 2.6 and result["agent_reward_mean"]["long"] > 4.3


def test_evaluation_sums_each_teams_episode():
    with shoal.PPO(env=lambda: GuessEnv(), num_envs=2, sgd_minibatch_size=64, save_outputs=False, verbose=0) as algo:
        out = algo.evaluate(4)
    assert out["episodes"] == 4 and out["episode_len_mean"] == 5.0
    assert 0.0 <= out["episode_reward_min"] <= out["episode_reward_max"] <= 8.0
