"""The offline learners (BC, MARWIL, CQL), ``shoal dataset record``, mixed inputs and the
off-policy estimates reported with each evaluation."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CounterEnv
from tensordict import TensorDict

import shoal
from shoal.cli import main
from shoal.config import BCConfig
from shoal.offline import DatasetFile, dataset_folders
from shoal.offline.episodes import EpisodeQuota
from shoal.offline.minari_files import DatasetError, EpisodeArrays, ShardWriter
from shoal.offline.reader import returns_to_go

pytest.importorskip("h5py")
QUIET = dict(save_outputs=False, verbose=0)


def record_ppo(folder, env="CartPole-v1", steps=1024, **settings):
    with shoal.PPO(env=env, seed=1, num_envs=4, output=str(folder), **QUIET, **settings) as ppo:
        ppo.learn(steps)
    return folder


@pytest.fixture(scope="module")
def cartpole_record(tmp_path_factory):
    """``record_ppo``'s default dataset, recorded once for the tests that only build a learner on it."""
    return record_ppo(tmp_path_factory.mktemp("cartpole_record") / "d")


def test_returns_to_go_match_a_slow_loop():
    rewards = np.random.default_rng(0).normal(size=37).astype(np.float32)
    slow = [sum(0.9**k * float(r) for k, r in enumerate(rewards[t:])) for t in range(len(rewards))]
    assert returns_to_go(rewards, 0.9) == pytest.approx(slow, rel=1e-5)


def test_marwil_reads_each_step_s_return_to_go(tmp_path):
    record_ppo(tmp_path / "d", env=lambda: CounterEnv(), steps=64, sgd_minibatch_size=64)
    with shoal.MARWIL(env=lambda: CounterEnv(), input=str(tmp_path / "d"), gamma=0.5, train_freq=5, **QUIET) as m:
        rollout = m.algorithm.rollout.start_rollout()
        m.collector.collect(rollout)
    assert rollout["return_to_go"][0, :5].tolist() == pytest.approx([1.9375, 1.875, 1.75, 1.5, 1.0])


def test_marwil_with_beta_0_is_behaviour_cloning_plus_a_value_function(cartpole_record):
    with shoal.MARWIL(env="CartPole-v1", input=str(cartpole_record), beta=0.0, seed=1, **QUIET) as m:
        learner = m.algorithm.learners["default_policy"]
        policy = learner.policy
        batch = TensorDict(
            {"obs": torch.randn(32, 4), "action": torch.randint(0, 2, (32,)), "return_to_go": torch.rand(32) * 10},
            batch_size=[32],
        )
        with torch.no_grad():
            log_prob, _, value = policy.evaluate(batch["obs"], batch["action"], False)
        stats, _ = learner.learn(batch.clone(), None)
    assert float(stats["policy_loss"]) == pytest.approx(float(-log_prob.mean()), rel=1e-5)
    assert float(stats["vf_loss"]) == pytest.approx(float(0.5 * (batch["return_to_go"] - value).square().mean()))
    assert float(stats["weight_mean"]) == 1.0


def test_discrete_cql_s_conservative_term_is_logsumexp_minus_the_recorded_action_s_value(cartpole_record):
    with shoal.CQL(env="CartPole-v1", input=str(cartpole_record), min_q_weight=2.0, **QUIET) as cql:
        learner = cql.algorithm.learners["default_policy"]
    q_all = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    action = torch.tensor([1, 0])
    q = q_all.gather(1, action[:, None]).squeeze(1)
    mask = torch.tensor([[True, True], [True, False]])
    batch = TensorDict({"action_mask": mask}, batch_size=[2])
    expected = 2.0 * ((math.log(math.exp(1) + math.exp(3)) - 3.0) + (0.0 - 0.0)) / 2  # the masked action is left out
    assert float(learner.penalty(q_all, q, batch)) == pytest.approx(expected)
    assert type(cql.algorithm).__name__ == "DiscreteCQL" and cql.algo_name == "CQL"


@pytest.mark.slow  # a learning run
def test_box_cql_keeps_the_values_of_actions_the_data_never_took_lower_than_sac(tmp_path):
    """Recorded actions all within 0.2 of 0 (a narrow behaviour) on a one-step task: SAC's critic
    values the far actions as its fit extrapolates, CQL's pushes them down."""
    from conftest import TargetEnv

    rng = np.random.default_rng(0)
    shard = ShardWriter(
        tmp_path / "narrow" / "default_policy",
        TargetEnv().observation_space,
        TargetEnv().action_space,
    )
    for _ in range(300):
        target = rng.uniform(-1, 1, 1).astype(np.float32)
        action = rng.uniform(-0.2, 0.2, 1).astype(np.float32)
        reward = -float(np.square(action - target).sum())
        shard.add(
            EpisodeArrays(
                np.stack([target, target]), action[None], np.array([reward]), np.array([True]), np.array([False])
            )
        )
    shard.close()
    gaps = {}
    for preset in (shoal.SAC, shoal.CQL):
        settings = dict(env=TargetEnv, input=str(tmp_path / "narrow"), seed=1, learning_starts=200, train_freq=100)
        extra = {"num_actions": 4} if preset is shoal.CQL else {}
        with preset(**settings, gradient_steps=20, sgd_minibatch_size=64, **extra, **QUIET) as algo:
            algo.learn(600)
            learner = algo.algorithm.learners["default_policy"]
            with torch.no_grad():
                x = learner.policy.features(torch.rand(256, 1) * 2 - 1)
                near = learner.critic.values(x, torch.zeros(256, 1)).mean()
                edge = learner.critic.values(x, torch.ones(256, 1)).mean()
            gaps[preset.__name__] = float(edge - near)
    assert gaps["CQL"] < gaps["SAC"] - 1.0, gaps


def test_record_writes_whole_episodes_deterministic_or_exploring(tmp_path, capsys):
    run = tmp_path / "run"
    with shoal.PPO(env="CartPole-v1", seed=1, run_dir=str(run), verbose=0) as ppo:
        ppo.learn(2048)
    assert main(["dataset", "record", str(run), "--episodes", "7", "--out", str(tmp_path / "greedy")]) == 0
    assert "wrote 7 episodes" in capsys.readouterr().out
    assert main(["dataset", "record", str(run), "--episodes", "3", "--explore", "--out", str(tmp_path / "x")]) == 0
    greedy = [ep for f in dataset_folders(tmp_path / "greedy") for ep in DatasetFile.open(f).episodes()]
    explored = [ep for f in dataset_folders(tmp_path / "x") for ep in DatasetFile.open(f).episodes()]
    assert len(greedy) == 7 and len(explored) == 3
    for ep in greedy + explored:
        assert ep.terminations[-1] or ep.truncations[-1]  # whole episodes only
    assert all((ep.infos["action_log_prob"][:-1] == 0).all() for ep in greedy)  # its own choice, probability 1
    assert any((ep.infos["action_log_prob"][:-1] < 0).any() for ep in explored)
    assert main(["dataset", "record", str(run), "--episodes", "0", "--out", str(tmp_path / "z")]) == 2


class LongOrShort(CounterEnv):
    """Every other instance plays 40-step episodes, the others 2-step ones."""

    made = 0

    def __init__(self):
        super().__init__(limit=40 if LongOrShort.made % 2 else 2)
        LongOrShort.made += 1


gym.register("LongOrShort-v0", entry_point=LongOrShort)


def test_record_takes_each_row_s_episodes_in_turn_so_short_episodes_are_not_favoured(tmp_path):
    run = tmp_path / "run"
    with shoal.PPO(env="LongOrShort-v0", num_envs=4, sgd_minibatch_size=64, seed=1, run_dir=str(run), verbose=0) as ppo:
        ppo.learn(256)
    # in 64 steps the short rows end 64 episodes; the first 8 to finish would all be short
    assert main(["dataset", "record", str(run), "--episodes", "8", "--out", str(tmp_path / "d")]) == 0
    lengths = [len(ep) for f in dataset_folders(tmp_path / "d") for ep in DatasetFile.open(f).episodes()]
    assert sorted(lengths) == [2] * 4 + [40] * 4


gym.register("Endless-v0", entry_point=lambda: CounterEnv(limit=10**9))


def test_record_stops_and_says_so_when_no_episode_ends(tmp_path, monkeypatch):
    from shoal.train import recording

    run = tmp_path / "run"
    with shoal.PPO(env="Endless-v0", num_envs=2, sgd_minibatch_size=64, seed=1, run_dir=str(run), verbose=0) as ppo:
        ppo.learn(128)
    monkeypatch.setattr(recording, "STALLED_STEPS", 640)
    with pytest.raises(shoal.ConfigError, match=r"no episode of 'Endless-v0' ended in 640 steps of each env"):
        recording.record_dataset(run, tmp_path / "d", 2)


def quota_episode(length: int) -> EpisodeArrays:
    return EpisodeArrays(
        observations=np.zeros((length + 1, 1), np.float32),
        actions=np.zeros(length, np.int64),
        rewards=np.full(length, float(length), np.float32),
        terminations=np.zeros(length, bool),
        truncations=np.eye(length, dtype=bool)[-1],
    )


def test_episode_quota_takes_rows_in_turn_waits_for_a_long_episode_and_skips_unwritten_policies():
    quota = EpisodeQuota(3, ["learner"])
    acting = np.arange(3)
    # row 1 plays a fixed opponent; row 2 is in a long episode while row 0 ends three short ones
    finished = [("learner", 0, quota_episode(2)), ("opponent", 1, quota_episode(2))] * 3
    taken = quota.offer(finished, acting)
    assert [len(ep) for _, ep in taken] == [2]  # row 0's first, then row 1's (skipped); waits for row 2
    assert not quota.full
    taken = quota.offer([("learner", 2, quota_episode(30))], acting)
    assert [len(ep) for _, ep in taken] == [30, 2]  # row 2's first, then row 0's second
    assert quota.full
    assert quota.offer([("learner", 2, quota_episode(5))], acting) == []
    assert quota.counts == {"learner": 3}


def test_episode_quota_waits_for_a_row_that_starts_acting_late():
    quota = EpisodeQuota(3, ["p"])
    assert len(quota.offer([("p", 0, quota_episode(1))], np.array([0]))) == 1
    assert len(quota.offer([("p", 0, quota_episode(1))], np.array([0, 5]))) == 1  # row 5 acts from now on
    assert quota.offer([("p", 0, quota_episode(1))], np.array([0, 5])) == []  # row 5's first episode is awaited
    assert [len(ep) for _, ep in quota.offer([("p", 5, quota_episode(7))], np.array([0, 5]))] == [7]
    assert quota.full


def test_mixing_weights_draw_each_input_s_episodes(tmp_path):
    def counter(limit):
        return lambda: CounterEnv(limit=limit)

    short, long = tmp_path / "short", tmp_path / "long"
    for folder, limit in ((short, 2), (long, 6)):
        with shoal.PPO(
            env=counter(limit),
            num_envs=2,
            sgd_minibatch_size=64,
            output=str(folder),
            **QUIET,
        ) as ppo:
            ppo.learn(64)
    settings = dict(env=lambda: CounterEnv(limit=6), train_freq=600, seed=3, **QUIET)
    with shoal.BC(input={str(short): 3.0, str(long): 1.0}, **settings) as bc:
        rollout = bc.algorithm.rollout.start_rollout()
        bc.collector.collect(rollout)
    lengths = bc.collector.truncations.obs[:, 0]  # each episode's last observation counts its steps
    assert set(lengths.tolist()) == {2.0, 6.0}
    share = float((lengths == 2).float().mean())
    assert 0.65 < share < 0.85  # 3 of 4 episodes from the short input


def test_each_evaluation_reports_the_off_policy_estimates(tmp_path):
    data = record_ppo(tmp_path / "d", steps=2048)
    settings = dict(
        env="CartPole-v1",
        input=str(data),
        seed=1,
        evaluation_interval=1,
        evaluation_num_episodes=2,
        evaluation_deterministic=False,
        off_policy_estimation_methods=["is", "wis", "dm", "dr"],
        off_policy_estimation_episodes=20,
        off_policy_estimation_config={"iterations": 3, "epochs_per_iteration": 1},
        **QUIET,
    )
    with shoal.BC(**settings) as bc:
        result = bc.train()
        gamma = bc.config.gamma
    estimates = result["evaluation"]["off_policy_estimation"]
    assert set(estimates) == {"v_behaviour", "is", "wis", "dm", "dr"}
    assert all(math.isfinite(v) for v in estimates.values())
    # v_behaviour: the mean discounted return of the first 20 recorded episodes, read in file order
    episodes = [ep for f in dataset_folders(data) for ep in DatasetFile.open(f).episodes()][:20]
    returns = [float(np.sum(ep.rewards * gamma ** np.arange(len(ep)))) for ep in episodes]
    assert estimates["v_behaviour"] == pytest.approx(np.mean(returns), rel=1e-5)


def test_estimates_that_need_what_a_dataset_lacks_are_refused(tmp_path):
    folder = tmp_path / "dqn"
    with shoal.DQN(env="CartPole-v1", output=str(folder), learning_starts=10**9, **QUIET) as dqn:
        dqn.learn(1000)  # no log-probabilities: DQN stores none
    settings = dict(env="CartPole-v1", input=str(folder), off_policy_estimation_methods=["is"], **QUIET)
    with pytest.raises(DatasetError, match=r"need the behaviour policy's probabilities"):
        shoal.BC(**settings)  # refused before training
    with shoal.BC(**(settings | {"off_policy_estimation_methods": ["dm"]})) as bc:
        assert set(bc.estimate_off_policy()) == {"v_behaviour", "dm"}
    with pytest.raises(shoal.ConfigError, match="need recorded episodes"):
        shoal.PPO(env="CartPole-v1", off_policy_estimation_methods=["is"], **QUIET)
    missing = settings | {
        "off_policy_estimation_input": str(tmp_path / "nowhere"),
        "off_policy_estimation_methods": ["dm"],
    }
    with pytest.raises(
        DatasetError, match=r"off_policy_estimation_input '.*nowhere' \(the episodes .*\) does not exist"
    ):
        shoal.BC(**missing)
    with pytest.raises(DatasetError, match=r"need Discrete actions"):
        shoal.SAC(
            env="Pendulum-v1", off_policy_estimation_input=str(folder), off_policy_estimation_methods=["dm"], **QUIET
        )


def test_estimates_read_checked_episodes_and_only_the_legal_actions(tmp_path):
    env = gym.make("CartPole-v1")
    shard = ShardWriter(tmp_path / "bad" / "default_policy", env.observation_space, env.action_space)
    rewards = np.array([1.0, np.nan, 1.0])
    shard.add(
        EpisodeArrays(
            np.zeros((4, 4), np.float32), np.zeros(3, np.int64), rewards, np.eye(3, dtype=bool)[-1], np.zeros(3, bool)
        )
    )
    shard.close()
    with pytest.raises(DatasetError, match=r"episode_0: field 'rewards' holds \[nan\] at step 1"):
        shoal.BC(env="CartPole-v1", input=str(tmp_path / "bad"), off_policy_estimation_methods=["dm"], **QUIET)
    from shoal.offline.estimation import action_probabilities

    with shoal.DQN(env="CartPole-v1", seed=1, **QUIET) as dqn:
        policy = dqn.get_policy()
        policy.epsilon = 0.2
        obs = torch.randn(6, 4)
        mask = torch.tensor([[True, False]] * 3 + [[False, True]] * 3)
        probs = action_probabilities(policy, obs, False, 2, mask)
        assert torch.equal(probs, mask.float())  # one legal action: taken with probability 1
        free = action_probabilities(policy, obs, False, 2)
        assert torch.allclose(free.sort(1).values, torch.tensor([0.1, 0.9]).expand(6, 2))  # 0.2 spread over both


def write_episodes(folder, rewards_per_episode):
    """CartPole-shaped episodes (zero observations, action 0) with the given rewards, each ending in
    a termination."""
    env = gym.make("CartPole-v1")
    shard = ShardWriter(folder, env.observation_space, env.action_space)
    for rewards in rewards_per_episode:
        n = len(rewards)
        terminated = np.eye(n, dtype=bool)[-1]
        arrays = (np.zeros((n + 1, 4), np.float32), np.zeros(n, np.int64), np.asarray(rewards, np.float64))
        shard.add(EpisodeArrays(*arrays, terminated, np.zeros(n, bool)))
    shard.close()


def test_recorded_rewards_are_clipped_as_clip_rewards_says_and_not_normalized(tmp_path):
    write_episodes(tmp_path / "d" / "default_policy", [[5.0, -5.0, 0.5, 5.0]] * 4)
    settings = dict(env="CartPole-v1", input=str(tmp_path / "d"), train_freq=4, **QUIET)
    for algo, clip, reward, key in (
        (shoal.DQN, True, [1.0, -1.0, 1.0, 1.0], "reward"),
        (shoal.DQN, None, [5.0, -5.0, 0.5, 5.0], "reward"),  # CartPole's default: none
        (
            shoal.MARWIL,
            2.0,
            [2.0 - 0.5 * 1.25, -2.0 + 0.5 * 1.5, 0.5 + 0.5 * 2.0, 2.0],
            "return_to_go",
        ),  # of [2, -2, 0.5, 2]
    ):
        with algo(**settings, clip_rewards=clip, gamma=0.5) as learner:
            rollout = learner.algorithm.rollout.start_rollout()
            learner.collector.collect(rollout)
        assert rollout[key][0, :4].tolist() == pytest.approx(reward)
    with pytest.raises(shoal.ConfigError, match=r"normalize_reward=true scales rewards .* input="):
        shoal.DQN(**settings, normalize_reward=True)


def test_estimates_read_the_estimated_policy_s_own_episodes_in_a_run_s_output(tmp_path):
    write_episodes(tmp_path / "out" / "p0", [[1.0] * 3] * 2)
    write_episodes(tmp_path / "out" / "p1", [[5.0] * 3] * 2)
    settings = dict(env="CartPole-v1", input=str(tmp_path / "out"), policies=["p1"], gamma=0.5, **QUIET)
    estimation = dict(off_policy_estimation_methods=["dm"], off_policy_estimation_config={"iterations": 1})
    with shoal.BC(**settings, **estimation) as bc:
        assert bc.estimate_off_policy()["v_behaviour"] == pytest.approx(5.0 * (1 + 0.5 + 0.25))


def test_a_policy_that_never_takes_the_recorded_actions_gets_no_weight_from_wis(monkeypatch):
    """Its target log-probabilities are -inf: WIS's normaliser must not bring back weights that
    are merely small (1e-30 / mu each, which it divides into 1)."""
    from shoal.offline.estimation import LoggedEpisodes, estimate_policy

    logged = LoggedEpisodes(
        obs=torch.zeros(2, 2, 4),
        action=torch.zeros(2, 1, dtype=torch.long),
        reward=torch.tensor([[1.0], [3.0]]),
        terminated=torch.ones(2, 1, dtype=torch.bool),
        valid=torch.ones(2, 1, dtype=torch.bool),
        behaviour_log_prob=torch.full((2, 1), math.log(0.5)),
        where="two one-step episodes",
    )
    never = torch.tensor([[0.0, 1.0]]).expand(4, 2)  # the policy always takes action 1; action 0 was logged
    monkeypatch.setattr("shoal.offline.estimation.action_probabilities", lambda *args: never)
    got = estimate_policy(None, logged, ["is", "wis"], gamma=0.9, deterministic=True, actions=2, fqe={}, seed=0)
    assert got == {"v_behaviour": 2.0, "is": 0.0, "wis": 0.0}


def test_a_misspelt_fitted_q_setting_is_refused_before_training(tmp_path):
    with pytest.raises(shoal.ConfigError, match=r"has no key 'iteration'.* Did you mean 'iterations'\?"):
        BCConfig.build(env="CartPole-v1", input=str(tmp_path), off_policy_estimation_config={"iteration": 3})
