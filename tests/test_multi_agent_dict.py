"""RLlib-style dict envs (shoal.MultiAgentEnv): agents leaving, "__all__", turns, errors, learning."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.vector import make_backend
from tests.conftest import SHORT_TEAM_RUN

BOX2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


class DyingDictEnv(shoal.MultiAgentEnv):
    """Agents a0, a1, a2 see [k, t] and earn k + 1 a step. a0 terminates after step 1; step 2
    ends the episode for everyone through ``__all__`` (terminated, or truncated with ``cut``)."""

    def __init__(self, cut: bool = False):
        self.possible_agents = self.agents = ["a0", "a1", "a2"]
        self.observation_spaces = dict.fromkeys(self.possible_agents, BOX2)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.cut = cut

    def _obs(self, agents):
        return {a: np.array([int(a[1]), self.t], np.float32) for a in agents}

    def reset(self, *, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(self.agents), {}

    def step(self, action_dict):
        self.t += 1
        acting = list(action_dict)
        rewards = {a: float(int(a[1]) + 1) for a in acting}
        over = self.t >= 2
        terminateds = {"a0": True} if self.t == 1 else {}
        terminateds["__all__"] = over and not self.cut
        truncateds = {"__all__": over and self.cut}
        infos = {a: {"t": self.t} for a in acting}
        self.agents = [a for a in acting if not terminateds.get(a)]
        return self._obs(acting), rewards, terminateds, truncateds, infos


def run(backend, steps, actions=None):
    """(valid, terminated, truncated, reward) rows after each of ``steps`` steps."""
    backend.reset(0)
    backend.recv()
    seen = []
    for _ in range(steps):
        backend.send(torch.zeros(backend.num_rows, dtype=torch.long) if actions is None else actions)
        b = backend.recv()
        seen.append((b.valid.tolist(), b.terminated.tolist(), b.truncated.tolist(), b.reward.tolist()))
    return seen


def test_agents_done_early_become_padding_and_all_ends_the_episode_for_the_rest():
    backend = make_backend(DyingDictEnv(), 1)
    assert backend.agents == ["a0", "a1", "a2"] and backend.rows_per_env == 3
    assert run(backend, 3) == [
        ([True, True, True], [True, False, False], [False] * 3, [1.0, 2.0, 3.0]),  # a0 is done
        ([False, True, True], [False, True, True], [False] * 3, [0.0, 2.0, 3.0]),  # "__all__": a1, a2 too
        ([True, True, True], [True, False, False], [False] * 3, [1.0, 2.0, 3.0]),  # a new episode
    ]
    assert backend.batch.obs.tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 1.0]]  # a0's row is padding again
    assert backend.final_infos == {0: {"t": 1}}


def test_truncation_through_all_keeps_each_agents_last_observation():
    backend = make_backend(lambda: DyingDictEnv(cut=True), 1)
    seen = run(backend, 2)
    assert seen[1][:3] == ([False, True, True], [False] * 3, [False, True, True])
    batch = backend.recv()
    assert batch.final_obs[1:].tolist() == [[1.0, 2.0], [2.0, 2.0]]
    assert batch.obs.tolist() == [[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]  # already the next episode


class TurnsEnv(shoal.MultiAgentEnv):
    """x and o take turns (only the agent to move gets an observation); each move earns the mover
    1 and the waiting agent 0.5. Step 3 (x's second move) ends the episode while o waits."""

    def __init__(self):
        self.possible_agents = ["x", "o"]
        self.observation_spaces = dict.fromkeys(self.possible_agents, BOX2)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"x": np.zeros(2, np.float32)}, {}

    def step(self, action_dict):
        (mover,) = action_dict
        self.t += 1
        other = "o" if mover == "x" else "x"
        over = self.t >= 3
        return (
            {other: np.full(2, self.t, np.float32)},
            {mover: 1.0, other: 0.5},
            {"__all__": over},
            {"__all__": False},
            {},
        )


def test_turns_each_agent_acts_only_when_observed_and_the_end_reaches_the_waiting_one():
    # o's row is padding while x moves; at the end o is waiting, and its done flag still closes
    # its last decision, so GAE does not bootstrap it from the next episode.
    assert run(make_backend(TurnsEnv, 1), 4) == [
        ([True, False], [False, False], [False, False], [1.0, 0.5]),
        ([False, True], [False, False], [False, False], [0.5, 1.0]),
        ([True, False], [True, True], [False, False], [1.0, 0.5]),
        ([True, False], [False, False], [False, False], [1.0, 0.5]),
    ]


def test_a_dict_env_that_says_it_takes_turns_says_where_its_episode_ends():
    class Declared(TurnsEnv):
        turn_based = True

    assert make_backend(TurnsEnv, 1).batch.env_done is None
    backend = make_backend(Declared, 1)
    backend.reset(0)
    ends = []
    for _ in range(4):
        backend.send(torch.zeros(2, dtype=torch.long))
        ends.append(backend.recv().env_done.tolist())
    assert ends == [[False, False], [False, False], [True, True], [False, False]]


@pytest.mark.slow
def test_worker_processes_give_the_same_rows():
    serial = make_backend(TurnsEnv, 4)
    workers = make_backend(TurnsEnv, 4, num_workers=2)
    try:
        actions = torch.zeros(8, dtype=torch.long)
        assert run(serial, 7, actions) == run(workers, 7, actions)
        assert torch.equal(serial.recv().obs, workers.recv().obs)
    finally:
        workers.close()


class Duck(gym.Env):
    """RLlib's shape without shoal's base class: possible_agents and space dicts on a gym.Env."""

    def __init__(self, config=None):
        self.possible_agents = ["a"]
        self.observation_spaces = {"a": BOX2}
        self.action_spaces = {"a": gym.spaces.Discrete(2)}

    def reset(self, *, seed=None, options=None):
        return {"a": np.zeros(2, np.float32)}, {}

    def step(self, action_dict):
        return {"a": np.ones(2, np.float32)}, {"a": 1.0}, {"__all__": True}, {"__all__": False}, {}


@pytest.mark.parametrize(
    "env, agents", [(Duck(), ["a"]), (Duck, ["a"]), ("duck-dict-v0", ["a"]), (TurnsEnv, ["x", "o"])]
)
def test_dict_envs_are_recognised_as_instances_factories_and_registered_names(env, agents):
    shoal.register_env("duck-dict-v0", lambda config: Duck(config))
    backend = make_backend(env, 2)
    assert backend.agents == agents and backend.num_rows == 2 * len(agents)


def bad_step(**replace):
    """A DyingDictEnv whose step returns ``replace``'s entries instead of its own."""

    class Bad(DyingDictEnv):
        def step(self, action_dict):
            out = dict(zip(("obs", "rewards", "terminateds", "truncateds", "infos"), super().step(action_dict)))
            out.update(replace)
            return tuple(out.values())

    return Bad


@pytest.mark.parametrize(
    "replace, message",
    [
        ({"terminateds": {"a0": False}}, r"returned terminateds without the key '__all__' \(keys: \['a0'\]\)"),
        ({"truncateds": {}}, r"returned truncateds without the key '__all__'"),
        (
            {"terminateds": {"zz": True, "__all__": False}},
            r"terminateds for agent\(s\) \['zz'\], which are not in its "
            r"possible_agents \['a0', 'a1', 'a2'\]",
        ),
        ({"obs": {"zz": np.zeros(2, np.float32)}}, r"returned agent 'zz', which is not in its possible_agents"),
        ({"obs": {"a1": np.zeros(3, np.float32)}}, r"observation of shape \(3,\).*promises shape \(2,\)"),
        ({"obs": [np.zeros(2)]}, r"returned observations of type list; the dict API returns a dict keyed by agent id"),
    ],
)
def test_bad_outputs_name_what_is_wrong(replace, message):
    backend = make_backend(bad_step(**replace), 1)
    backend.reset(0)
    with pytest.raises(shoal.EnvError, match=message):
        backend.send(torch.zeros(3, dtype=torch.long))


def test_missing_spaces_are_named():
    class NoSpaces(DyingDictEnv):
        def __init__(self):
            super().__init__()
            self.action_spaces = {"a0": gym.spaces.Discrete(2)}

    with pytest.raises(shoal.EnvError, match=r"no action space for agent 'a1': set self.action_spaces"):
        make_backend(NoSpaces, 1)


class MatchEnv(shoal.MultiAgentEnv):
    """Cooperative: agents a and b each see a one-hot target of 3 and pick one; both earn the mean
    of the two picks' correctness. Five steps, then "__all__" ends the episode."""

    def __init__(self):
        self.possible_agents = self.agents = ["a", "b"]
        self.observation_spaces = dict.fromkeys(self.agents, gym.spaces.Box(0.0, 1.0, (3,), np.float32))
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(3))
        self.rng = np.random.default_rng()

    def _observe(self):
        self.target = self.rng.integers(0, 3, 2)
        return {a: np.eye(3, dtype=np.float32)[k] for a, k in zip(self.agents, self.target)}

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action_dict):
        self.t += 1
        shared = float(np.mean([action_dict[a] == k for a, k in zip(self.agents, self.target)]))
        over = self.t >= 5
        return (self._observe(), dict.fromkeys(self.agents, shared), {"__all__": over}, {"__all__": False}, {})


@pytest.mark.slow
def test_ppo_learns_a_cooperative_dict_env():
    with shoal.PPO(
        env=MatchEnv,
        **SHORT_TEAM_RUN,
    ) as algo:
        first = algo.train()
        algo.learn(6_000)
        result = algo.train()
    # The team's return is at most 2 agents x 5 steps = 10; picking at random earns about 10 / 3.
    assert first["episode_reward_mean"] < 5.0
    assert result["episode_reward_mean"] > 8.5
