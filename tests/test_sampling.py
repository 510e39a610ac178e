"""Sampling options: horizons (hard and soft), no_done_at_end, and the combinations they refuse."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.errors import ConfigError
from tests.conftest import CounterEnv

SMALL = dict(num_envs=2, rollout_fragment_length=12, sgd_minibatch_size=24, save_outputs=False, verbose=0)


def _collect(algo):
    rollout = algo.algorithm.buffer.start_rollout()
    algo.collector.collect(rollout)
    return rollout


def _episode_lengths(done: torch.Tensor) -> list[int]:
    """Lengths of the episodes that end inside ``done`` ([N, T]), each row starting an episode at 0."""
    lengths = []
    for row in done:
        ends = row.nonzero().squeeze(1).tolist()
        lengths += [b - a for a, b in zip([-1, *ends], ends)]
    return lengths


@pytest.mark.slow
def test_horizon_50_cuts_cartpole_and_bootstraps_from_the_next_observation():
    settings = dict(num_envs=4, rollout_fragment_length=160, sgd_minibatch_size=160, tuned=False)
    with shoal.PPO(env="CartPole-v1", horizon=50, seed=0, save_outputs=False, verbose=0, **settings) as algo:
        algo.learn(20_000)  # long enough that most episodes would outlive the horizon
        rollout = algo.algorithm.buffer.start_rollout()
        algo.collector.reset(1)
        algo.collector.collect(rollout)
        done = rollout["done"][:, :-1]
        lengths = _episode_lengths(done)
        assert lengths and max(lengths) == 50, lengths  # cut at 50, never later
        cut = algo.collector.truncations
        assert len(cut) > 0 and not rollout["terminated"][cut.row, cut.step].any()
        # the value target at the cut uses the value of the observation the env reached (the next
        # slot holds the reset's first observation instead)
        assert not torch.equal(cut.obs, rollout["obs"][cut.row, cut.step + 1])
        algo.algorithm.bootstrap_truncations(rollout, cut)
        with torch.no_grad():
            expected = algo.get_policy().value(cut.obs.clone())
        assert torch.allclose(rollout["final_value"][cut.row, cut.step], expected)
        assert algo.evaluate(5)["episode_reward_max"] == 50.0  # evaluation plays under the horizon too


def test_soft_horizon_cuts_the_episode_but_the_env_goes_on():
    with shoal.PPO(env=lambda: CounterEnv(limit=1000), horizon=5, soft_horizon=True, **SMALL) as algo:
        rollout = _collect(algo)
        envs = algo.backend.envs
    obs = rollout["obs"][:, :, 0]
    assert obs[0].tolist() == list(range(13))  # counting on through the cuts: no reset
    assert rollout["truncated"][:, :-1].nonzero()[:, 1].unique().tolist() == [4, 9]
    assert rollout["first"][0, [0, 5, 10]].all() and rollout["first"][0].sum() == 3  # each cut starts an episode
    assert not rollout["terminated"].any()
    assert envs[0].unwrapped.t == 12  # the env itself was never reset after the first time


def test_hard_horizon_resets_the_env():
    with shoal.PPO(env=lambda: CounterEnv(limit=1000), horizon=5, **SMALL) as algo:
        rollout = _collect(algo)
    assert rollout["obs"][0, :, 0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]


def test_no_done_at_end_makes_terminations_truncations():
    env = lambda: CounterEnv(limit=3, terminate=True)  # noqa: E731
    with shoal.PPO(env=env, **SMALL) as algo:
        assert _collect(algo)["terminated"][:, 2].all()
    with shoal.PPO(env=env, no_done_at_end=True, **SMALL) as algo:
        rollout = _collect(algo)
        cut = algo.collector.truncations
    assert not rollout["terminated"].any() and rollout["truncated"][:, 2].all()
    assert cut.obs[:, 0].unique().tolist() == [3.0]  # bootstrapped from the last observation


def test_horizon_on_worker_processes():
    with shoal.PPO(env=lambda: CounterEnv(limit=1000), horizon=4, num_workers=2, **SMALL) as algo:
        rollout = _collect(algo)
    assert rollout["obs"][:, :8, 0].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]] * 2


@pytest.mark.slow
def test_horizon_on_a_pettingzoo_parallel_env():
    pytest.importorskip("mpe2")
    with shoal.PPO(env="pettingzoo:mpe2.simple_spread_v3", horizon=10, **SMALL) as algo:
        rollout = _collect(algo)
    lengths = _episode_lengths(rollout["done"][:, :-1])
    assert lengths and set(lengths) == {10}  # the env's own limit is 25


class TurnsEnv:
    """Stand-in with an AEC env's API (agent_iter / last), enough to be told apart."""

    possible_agents = ["a"]

    def observation_space(self, agent):
        return gym.spaces.Box(0, 1, (1,))

    def agent_iter(self):
        return iter(())

    def last(self):
        return np.zeros(1), 0.0, False, False, {}


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(soft_horizon=True), r"soft_horizon=True cuts episodes at the horizon; set horizon=H too\."),
        (dict(horizon=0), r"bad value for 'horizon': 0: Input should be greater than or equal to 1"),
        (dict(env="ALE/Pong-v5", no_done_at_end=True), r"training episodes end at each lost life"),
        (
            dict(horizon=5, vectorization_mode="sync"),
            r"with vectorization_mode='sync' the envs are stepped as one vector",
        ),
        (dict(no_done_at_end=True, env="vmas:balance"), r"with 'vmas:balance' the envs are stepped as one vector"),
        (dict(horizon=5, backend="external"), r"with backend='external' the clients end their episodes"),
        (
            dict(env="pettingzoo:mpe2.simple_spread_v3", horizon=5, soft_horizon=True),
            r"soft_horizon=True needs a single-agent env",
        ),
        (dict(env=TurnsEnv, horizon=5), r"horizon / no_done_at_end apply to Gymnasium envs and PettingZoo Parallel"),
    ],
)
def test_combinations_that_make_no_sense_are_refused(settings, message):
    if "mpe2" in str(settings.get("env")):
        pytest.importorskip("mpe2")
    with pytest.raises(ConfigError, match=message):
        shoal.PPO(**{"env": "CartPole-v1", **SMALL, **settings})


class Aim(gym.Env):
    """One step: hit a target in [0, 100] (observed as target / 100) with a Box(0, 100) action."""

    def __init__(self, env_config=None):
        high = (env_config or {}).get("high", 100.0)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(0.0, high, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(0, 100)
        return np.array([self.target / 100], np.float32), {}

    def step(self, action):
        return np.array([self.target / 100], np.float32), -abs(float(action[0]) - self.target) / 100, True, False, {}


@pytest.mark.parametrize(
    "clip,normalize,expected",
    [
        (True, False, [0.0, 0.0, 0.5, 100.0]),
        (False, False, [-2.0, 0.0, 0.5, 300.0]),
        (True, True, [0.0, 50.0, 75.0, 100.0]),
        (False, True, [-50.0, 50.0, 75.0, 15050.0]),
    ],
)
def test_box_actions_reach_the_env_clipped_and_rescaled_as_configured(clip, normalize, expected):
    with shoal.PPO(env=Aim, clip_actions=clip, normalize_actions=normalize, **SMALL) as algo:
        policy_actions = torch.tensor([[-2.0], [0.0], [0.5], [300.0]])
        assert algo.backend.env_actions(policy_actions)[:, 0].tolist() == expected


def test_normalize_actions_refuses_unbounded_boxes_and_replay_actor_critics():
    unbounded = lambda: Aim({"high": np.inf})  # noqa: E731
    with pytest.raises(
        ConfigError,
        match=r"rescales \[-1, 1\] to the action bounds of env .* Box\(0.0, inf, \(1,\), float32\) has infinite",
    ):
        shoal.PPO(env=unbounded, normalize_actions=True, **SMALL)
    with pytest.raises(ConfigError, match="SAC, TD3 and MADDPG always act in"):
        shoal.SAC(env=Aim, normalize_actions=True, save_outputs=False)


@pytest.mark.slow
def test_normalized_actions_learn_a_box_of_0_to_100_with_default_settings():
    returns = {}
    for normalize in (True, False):
        with shoal.PPO(env=Aim, normalize_actions=normalize, seed=1, save_outputs=False, verbose=0) as algo:
            algo.learn(10_000)
            returns[normalize] = algo.evaluate(50)["episode_reward_mean"]
    # a uniformly random action misses by 0.33 on average; normalized, PPO's default Gaussian covers
    # the range and learns to aim; raw, it starts at 0 with a spread of 1 on a range of 100
    assert returns[True] > -0.2 and returns[False] < -0.25, returns


class ThreeRewards(CounterEnv):
    """Episodes of three steps paying -5, 0 and 3."""

    def __init__(self):
        super().__init__(limit=3)

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, (-5.0, 0.0, 3.0)[self.t - 1], terminated, truncated, info


def test_clip_rewards_changes_what_the_loss_sees_not_the_logged_return():
    with shoal.PPO(env=ThreeRewards, clip_rewards=True, **SMALL) as algo:
        result = algo.train()
        learned = algo.algorithm.buffer.rollout["reward"][:, :-1]
    assert learned[0, :3].tolist() == [-1.0, 0.0, 1.0] and set(learned.unique().tolist()) == {-1.0, 0.0, 1.0}
    assert result["episode_reward_mean"] == -2.0  # -5 + 0 + 3, raw


def test_a_checkpoint_keeps_the_step_count_under_the_resumed_runs_own_horizon(tmp_path):
    settings = dict(env="CartPole-v1", horizon=30, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16)
    with shoal.PPO(**settings, run_dir=str(tmp_path / "run"), verbose=0) as algo:
        algo.train()
        path = algo.save()
        counts = [env.episode_steps for env in algo.backend.envs]
    with shoal.PPO.from_checkpoint(path, horizon=9) as resumed:
        envs = resumed.backend.envs
        assert [env.episode_steps for env in envs] == counts and max(counts) > 0  # the episodes go on
        assert envs[0].rules.horizon == 9  # under the new horizon, not the saved one
    with (
        pytest.warns(UserWarning, match="wrappers differ from the checkpoint's"),
        shoal.PPO.from_checkpoint(path, horizon=None) as resumed,
    ):
        resumed.train()  # without the wrapper: new episodes, no crash


def test_video_evaluation_and_a_served_checkpoint_follow_the_rules(tmp_path):
    pytest.importorskip("imageio")
    from shoal.serve import checkpoint_server

    settings = dict(env="CartPole-v1", horizon=7, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16)
    with shoal.PPO(**settings, run_dir=str(tmp_path / "run"), verbose=0) as algo:
        out = algo.evaluate(1, video_dir=tmp_path / "video")
        path = algo.save()
    assert out["episode_len_mean"] <= 7
    with checkpoint_server(path, port=0) as server:  # served episodes are the clients' to end
        assert server.url


def test_normalized_actions_stay_inside_any_bounds():
    generator = torch.Generator().manual_seed(0)
    low = torch.rand(4000, generator=generator) * 200 - 100
    high = low + torch.rand(4000, generator=generator) * 50 + 1e-3
    env = lambda: Aim()  # noqa: E731
    with shoal.PPO(env=env, normalize_actions=True, **SMALL) as algo:
        backend = algo.backend
        backend._act_low, backend._act_high = low, high
        backend.configure_actions(clip=True, normalize=True)
        taken = torch.from_numpy(backend.env_actions(torch.tensor([-1.0, 1.0]).repeat_interleave(2000)))
    assert ((taken >= low) & (taken <= high)).all()


def test_grpo_fragments_follow_the_horizon_and_refuse_a_soft_one():
    with shoal.GRPO(env="CartPole-v1", horizon=40, num_envs=8, save_outputs=False, verbose=0) as algo:
        assert algo.config.rollout_fragment_length == 40  # CartPole's own limit is 500
    with pytest.raises(ConfigError, match="soft_horizon=True has no use with GRPO"):
        shoal.GRPO(env="CartPole-v1", horizon=40, soft_horizon=True, save_outputs=False)


class SitOut:
    """A two-agent ParallelEnv where agent 'b' acts only on even steps (it sits the odd ones out);
    its episodes never end by themselves."""

    possible_agents = ["a", "b"]
    metadata = {}

    def observation_space(self, agent):
        return gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["a", "b"]
        return self._obs(), {a: {} for a in self._obs()}

    def _obs(self):
        present = ["a", "b"] if self.t % 2 == 0 else ["a"]
        return {a: np.full(1, self.t, np.float32) for a in present}

    def step(self, actions):
        self.t += 1
        obs = self._obs()
        never = dict.fromkeys(obs, False)
        return obs, dict.fromkeys(obs, 0.0), never, dict(never), {a: {} for a in obs}

    def close(self):
        pass


def test_a_pettingzoo_cut_ends_agents_that_sat_the_step_out():
    with shoal.PPO(env=lambda: SitOut(), horizon=3, **SMALL) as algo:
        rollout = _collect(algo)
    done = rollout["done"][:, :-1]  # rows: env 0's a, b, then env 1's
    assert done[0, 2] and done[1, 2], done[:2]  # b sat out step 3 (t odd) and still ends with the episode
