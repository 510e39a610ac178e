"""GRPO: per-env reset seeds on every backend, groups of envs that start alike, group-relative
advantages against a slow loop, the collector's until-done rollouts, the KL penalty to the
reference policy, clear config errors, and a CartPole run that learns."""

import statistics

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.algos.losses import kl_k3
from shoal.algos.returns import group_relative
from shoal.config import GRPOConfig, declared_episode_steps
from shoal.envs.examples import TargetGrid
from shoal.errors import ConfigError
from shoal.vector import make_backend

QUIET = dict(save_outputs=False, verbose=0)
SMALL = dict(env="CartPole-v1", num_envs=6, group_size=3, rollout_fragment_length=60, sgd_minibatch_size=64, **QUIET)


class SeedLengthEnv(gym.Env):
    """Episodes of ``1 + seed % 10`` steps (set by the last seeded reset), reward 1 per step,
    obs = [seed, step]."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.seed_, self.limit, self.t = 0, 1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed_, self.limit = seed, 1 + seed % 10
        self.t = 0
        return np.array([self.seed_, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.seed_, self.t], np.float32), 1.0, self.t >= self.limit, False, {}


# ----- per-env reset seeds ----------------------------------------------------------------------
def test_an_int_seed_still_seeds_env_i_with_seed_plus_i():
    backend = make_backend("CartPole-v1", 3)
    backend.reset(7)
    for i in range(3):
        expected = gym.make("CartPole-v1").reset(seed=7 + i)[0]
        assert np.array_equal(backend.batch.obs[i].numpy(), expected)


def test_a_list_gives_each_env_its_own_seed():
    backend = make_backend("CartPole-v1", 4)
    backend.reset([5, 5, 9, 9])
    obs = backend.batch.obs
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[2], obs[3]) and not torch.equal(obs[0], obs[2])
    assert np.array_equal(obs[2].numpy(), gym.make("CartPole-v1").reset(seed=9)[0])
    with pytest.raises(ConfigError, match="one int per env"):
        backend.reset([1, 2, 3])


def test_sync_vector_envs_take_a_list_and_natively_vectorized_ones_say_they_cannot():
    sync = make_backend("CartPole-v1", 4, vectorization_mode="sync")
    sync.reset([3, 3, 4, 4])
    assert torch.equal(sync.batch.obs[0], sync.batch.obs[1]) and not torch.equal(sync.batch.obs[1], sync.batch.obs[2])
    native = make_backend("CartPole-v1", 4, vectorization_mode="vector_entry_point")
    native.reset(3)  # one int: as before
    with pytest.raises(ConfigError, match="cannot reset each env with its own seed"):
        native.reset([3, 3, 4, 4])


def test_multi_agent_envs_stepped_one_by_one_take_per_env_seeds():
    backend = make_backend(lambda: TargetGrid(num_agents=3), 3)
    backend.reset([2, 2, 8])
    obs = backend.batch.obs.view(3, 3, -1)
    assert torch.equal(obs[0], obs[1]) and not torch.equal(obs[0], obs[2])


def test_vmas_cannot_reset_each_env_with_its_own_seed():
    pytest.importorskip("vmas")
    backend = make_backend("vmas:balance", 2, {"n_agents": 2})
    backend.reset(0)
    with pytest.raises(ConfigError, match="VMAS scenario.*cannot reset each env with a seed of its own"):
        backend.reset([1, 1])


@pytest.mark.slow
def test_worker_processes_get_their_slice_of_the_seeds():
    serial = make_backend("CartPole-v1", 4)
    workers = make_backend("CartPole-v1", 4, num_workers=2)
    try:
        for seed in ([4, 4, 6, 6], [1, 2, 3, 4], 11):
            serial.reset(seed)
            workers.reset(seed)
            assert torch.equal(serial.recv().obs, workers.recv().obs)
    finally:
        workers.close()


# ----- groups -----------------------------------------------------------------------------------
def test_the_envs_of_a_group_start_alike_and_each_iteration_draws_new_seeds():
    with shoal.GRPO(**SMALL) as algo:
        rollout = algo.algorithm.buffer.rollout
        starts = []
        for _ in range(2):
            algo.train()
            first = rollout["obs"][:, 0].view(2, 3, -1)  # [groups, group_size, obs]
            assert torch.equal(first[0], first[0, :1].expand_as(first[0]))
            assert torch.equal(first[1], first[1, :1].expand_as(first[1]))
            assert not torch.equal(first[0, 0], first[1, 0])
            starts.append(first[:, 0].clone())
        assert not torch.equal(starts[0], starts[1])
        assert algo.algorithm.group_seeds(0) != algo.algorithm.group_seeds(1)
        assert algo.algorithm.group_seeds(1) == algo.algorithm.group_seeds(1)  # drawn from (seed, iteration)


def _reference_advantages(reward, done, valid, group_size, eps):
    """One row and one step at a time: each row's first episode, its return, the group statistics."""
    n, t = reward.shape
    returns, first = [], torch.zeros(n, t, dtype=torch.bool)
    for row in range(n):
        total, ended = 0.0, False
        for step in range(t):
            if ended:
                break
            if valid[row, step]:
                total += float(reward[row, step])
                first[row, step] = True
            ended = bool(done[row, step])
        returns.append(total)
    advantage = torch.zeros(n, t)
    for start in range(0, n, group_size):
        group = returns[start : start + group_size]
        mean, std = statistics.mean(group), statistics.stdev(group)
        for row in range(start, start + group_size):
            for step in range(t):
                if first[row, step]:
                    advantage[row, step] = (returns[row] - mean) / (std + eps)
    return advantage, first, torch.tensor(returns)


@pytest.mark.parametrize("seed", range(5))
def test_group_relative_advantages_match_a_slow_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t, g = 12, 9, 3
    reward = torch.randn(n, t, generator=gen)
    done = torch.rand(n, t, generator=gen) < 0.2
    valid = torch.rand(n, t, generator=gen) < 0.9
    done[0] = False  # an episode the rollout cut: counted with the return it reached
    advantage, first, returns = group_relative(reward, done, valid, group_size=g, eps=1e-4)
    ref_adv, ref_first, ref_returns = _reference_advantages(reward, done, valid, g, 1e-4)
    assert torch.equal(first, ref_first)
    torch.testing.assert_close(returns, ref_returns)
    torch.testing.assert_close(advantage, ref_adv)
    assert torch.all(advantage[~first] == 0)  # the tail after the first episode learns nothing


def test_a_group_whose_episodes_all_return_the_same_gets_no_advantage():
    reward = torch.ones(4, 5)
    done = torch.zeros(4, 5, dtype=torch.bool)
    done[:, 2] = True
    advantage, first, returns = group_relative(reward, done, torch.ones(4, 5, dtype=torch.bool), group_size=2)
    assert torch.equal(returns, torch.full((4,), 3.0)) and torch.all(advantage == 0)
    assert first[:, :3].all() and not first[:, 3:].any()


# ----- the until-done collector -----------------------------------------------------------------
def _until_done(algo, seeds):
    algo.collector.reset(seeds)
    rollout = algo.algorithm.buffer.start_rollout()
    return rollout, algo.collector.collect(rollout, until_done=True)


def test_until_done_stops_once_every_env_has_ended_an_episode_and_pads_the_rest():
    with shoal.GRPO(env=SeedLengthEnv, num_envs=4, group_size=2, rollout_fragment_length=10, **QUIET) as algo:
        algo.tracker.summarize()  # count this rollout's episodes only
        rollout, steps = _until_done(algo, [1, 1, 4, 4])  # episodes of 2 and 5 steps
        assert steps == 4 * 5  # one group of envs (serial): all step until the slowest ended
        valid = rollout["valid"][:, :10]
        assert valid[:, :5].all() and not valid[:, 5:].any()
        for key in ("done", "terminated", "truncated"):
            assert not rollout[key][:, 5:10].any(), key
        assert torch.all(rollout["reward"][:, 5:10] == 0)
        assert rollout["done"][:, :5].tolist() == [[0, 1, 0, 1, 0]] * 2 + [[0, 0, 0, 0, 1]] * 2
        assert torch.equal(rollout["obs"][:, 5], algo.backend.batch.obs)  # where each row stands, as when parked at T
        assert algo.tracker.summarize()["episodes_this_iter"] == 6  # rows 0 and 1 ended twice

        # the next reset abandons the episodes under way: the tracker starts them afresh
        rollout, steps = _until_done(algo, [2, 2, 2, 2])
        lengths = [2] * 4 + [5] * 2 + [3] * 4  # the two partial episodes of rows 0 and 1 are gone
        assert steps == 4 * 3 and algo.tracker.summarize()["episode_len_mean"] == pytest.approx(sum(lengths) / 10)


@pytest.mark.slow
def test_until_done_parks_each_async_group_on_its_own():
    kw = dict(num_envs=4, group_size=2, rollout_fragment_length=10, num_workers=2, async_factor=2, **QUIET)
    with shoal.GRPO(env=SeedLengthEnv, **kw) as algo:
        rollout, steps = _until_done(algo, [1, 1, 4, 4])
        assert steps == 2 * 2 + 2 * 5  # the steps the groups took, not num_envs x the fragment
        assert rollout["valid"][:, :10].sum(1).tolist() == [2, 2, 5, 5]


def test_timesteps_count_the_steps_taken():
    with shoal.GRPO(**SMALL) as algo:
        result = algo.train()
        taken = int(algo.algorithm.buffer.rollout["valid"][:, :-1].sum())
        assert result["timesteps_this_iter"] == taken < 6 * 60
        assert result["learn_steps"] <= taken and result["episodes_unfinished"] == 0


# ----- the KL penalty ---------------------------------------------------------------------------
def _kl_to_reference(algo) -> float:
    obs = algo.algorithm.buffer.rollout["obs"][:, :-1].reshape(-1, 4)
    action = algo.algorithm.buffer.rollout["action"][:, :-1].reshape(-1)
    with torch.no_grad():
        logp = algo.algorithm.policy.evaluate(obs, action, False)[0]
        ref = algo.algorithm.reference.evaluate(obs, action, False)[0]
    return kl_k3(logp, ref, None).item()


def test_the_kl_term_is_zero_against_itself_and_positive_after_an_update():
    with shoal.GRPO(**SMALL, kl_coef=0.1, num_sgd_iter=4) as algo:
        algo.algorithm.buffer.rollout["obs"].normal_()  # some observations to score before the first rollout
        assert _kl_to_reference(algo) == 0.0
        result = algo.train()
        assert result["kl"] > 0 and _kl_to_reference(algo) > 0
    with shoal.GRPO(**SMALL) as algo:
        assert algo.algorithm.reference is None and "kl" not in algo.train()


def test_a_checkpoint_from_before_the_on_policy_base_loads():
    """GRPO's optimizer and generator once sat at the top of its state; they load into its learner."""
    with shoal.GRPO(**SMALL, kl_coef=0.1) as algo:
        algo.train()
        state = algo.algorithm.state_dict()
        learner = state.pop("learners")["default_policy"]
        old = state | {"optimizer": learner["optimizer"], "generator": learner["generator"]}
    with shoal.GRPO(**SMALL, kl_coef=0.1) as fresh:
        fresh.algorithm.load_state_dict(old)
        restored = fresh.algorithm.learners["default_policy"]
        assert torch.equal(restored.generator.get_state(), learner["generator"])
        assert restored.optimizer.state_dict()["state"].keys() == learner["optimizer"]["state"].keys()


def test_the_reference_is_refreshed_every_interval():
    with shoal.GRPO(**SMALL, kl_coef=0.1, ref_update_interval=2) as algo:
        reference = algo.algorithm.reference
        initial = [p.clone() for p in reference.parameters()]
        algo.train()
        algo.train()  # iterations 0 and 1: the reference stays the policy training started from
        assert all(torch.equal(a, b) for a, b in zip(initial, reference.parameters()))
        after_two = [p.clone() for p in algo.algorithm.policy.parameters()]
        algo.train()  # iteration 2 starts by copying the policy as the first two left it
        assert all(torch.equal(a, b) for a, b in zip(after_two, reference.parameters()))
        assert not all(torch.equal(a, b) for a, b in zip(after_two, algo.algorithm.policy.parameters()))


# ----- config errors ----------------------------------------------------------------------------
def test_group_size_must_divide_num_envs():
    with pytest.raises(ConfigError, match=r"num_envs=10 must be a multiple of group_size=8.*Try num_envs=8"):
        GRPOConfig.build(num_envs=10, group_size=8)
    with pytest.raises(ConfigError, match="group_size"):
        GRPOConfig.build(group_size=1)
    with pytest.raises(ConfigError, match="normalize_reward"):
        GRPOConfig.build(normalize_reward=True)


def test_the_fragment_defaults_to_the_envs_episode_limit():
    assert GRPOConfig.build(env="CartPole-v1").rollout_fragment_length == 500
    assert GRPOConfig.build(env="Acrobot-v1", env_config={"max_episode_steps": 120}).rollout_fragment_length == 120
    assert GRPOConfig.build(env="Pendulum-v1", rollout_fragment_length=50).rollout_fragment_length == 50
    assert declared_episode_steps(SeedLengthEnv, {}) is None
    assert GRPOConfig.build(env=SeedLengthEnv, num_envs=8).train_batch_size == 8 * 500


def test_envs_grpo_cannot_group_are_refused_clearly():
    with pytest.raises(ConfigError, match="GRPO trains single-agent envs.*4 agent rows"):
        shoal.GRPO(env=lambda: TargetGrid(num_agents=4), num_envs=2, group_size=2, **QUIET)
    with pytest.raises(ConfigError, match="GRPO trains one policy"):
        shoal.GRPO(**SMALL | {"policies": ["a", "b"], "policy_mapping_fn": {"agent_0": "a"}})
    with pytest.raises(ConfigError, match="feedforward models only"):
        shoal.GRPO(**SMALL, model_config={"core": "lstm"})
    with (
        shoal.GRPO(**SMALL | {"num_envs": 4, "group_size": 2, "vectorization_mode": "vector_entry_point"}) as algo,
        pytest.raises(ConfigError, match="cannot reset each env with its own seed"),
    ):
        algo.train()


def test_grpo_is_registered_and_resumes_exactly(tmp_path):
    straight = shoal.Trainer(algo="grpo", **SMALL, kl_coef=0.05, seed=3)
    for _ in range(3):
        last = straight.train()
    first = shoal.GRPO(**SMALL, kl_coef=0.05, seed=3)
    first.train()
    path = first.save(tmp_path / "ckpt")
    resumed = shoal.GRPO.from_checkpoint(path)
    for _ in range(2):
        again = resumed.train()
    for a, b in zip(straight.get_policy().parameters(), resumed.get_policy().parameters()):
        assert torch.equal(a, b)
    assert again["policy_loss"] == last["policy_loss"] and again["timesteps_total"] == last["timesteps_total"]
    for algo in (straight, first, resumed):
        algo.close()


# ----- learning ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_grpo_learns_cartpole():
    with shoal.GRPO(env="CartPole-v1", seed=0, **QUIET) as algo:
        algo.learn(100_000)
        assert algo.evaluate(20)["episode_reward_mean"] >= 400
