"""Ray rollout workers: they learn like local envs, count every step once when an actor dies, and
carry recurrent state, replay exploration and checkpoints. One local cluster (2 CPUs, the
``ray_cluster`` fixture) serves the whole session."""

import copy
import importlib.util
import os
import re
import signal
import sys

import gymnasium as gym
import pytest
import test_faults
import torch
from test_faults import FlakyCartPole

import shoal
from shoal.collect.rollout_worker import RolloutWorker
from shoal.config import DQNConfig, PPOConfig
from shoal.errors import ConfigError
from shoal.vector.build import build_backend

# Ray itself is imported by the ray_cluster fixture, which only the slow tests take: the others
# check settings and a worker's body in process, and need not pay for the import
if importlib.util.find_spec("ray") is None:
    pytest.skip("could not import 'ray'", allow_module_level=True)


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster):
    """The session's Ray instance, made to pickle this module and test_faults by value: the actors
    cannot import the test files."""
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray_cluster.cloudpickle.register_pickle_by_value(test_faults)
    return ray_cluster


class DiesOnce(gym.Wrapper):
    """CartPole whose process is killed (as the OOM killer would) at its ``after``-th step, in the
    first env of the whole run to get there: ``marker`` is created by that env alone."""

    def __init__(self, config):
        super().__init__(gym.make("CartPole-v1"))
        self.marker, self.after, self.steps = config["marker"], config["after"], 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.after:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)


@pytest.mark.slow
def test_ppo_learns_cartpole_with_two_ray_workers(ray_cluster):
    with shoal.PPO(env="CartPole-v1", backend="ray", num_workers=2, seed=1, save_outputs=False, verbose=0) as algo:
        result = algo.learn(80_000)
        assert result["timesteps_total"] == algo.iteration * algo.config.train_batch_size
        assert "num_worker_restarts" not in result  # counted with recreate_failed_workers only
        assert algo.evaluate(num_episodes=10)["episode_reward_mean"] >= 475


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_every_step_is_counted_once(ray_cluster, tmp_path):
    """With recreate_failed_workers the actor dies in the middle of sampling; its fragment is
    sampled again by a new actor, the counters hold each iteration's batch exactly once, and a
    resumed run continues them."""
    config = dict(
        env=DiesOnce,
        env_config={"marker": str(tmp_path / "died"), "after": 100},
        backend="ray",
        num_workers=2,
        num_envs=4,
        rollout_fragment_length=64,
        recreate_failed_workers=True,
        seed=2,
        run_dir=str(tmp_path / "run"),
        verbose=0,
    )
    died = r"Ray rollout worker \d \(envs \d-\d of 'DiesOnce'\) died .* started anew with fresh envs"
    with pytest.warns(UserWarning, match=died), shoal.PPO(**config) as algo:
        pids = ray_cluster.get([worker.pid.remote() for worker in algo.backend.workers])
        for _ in range(4):  # 64 steps per env an iteration: the first env to take its 100th step dies in the second
            result = algo.train()
        assert (tmp_path / "died").exists()
        assert result["num_worker_restarts"] == 1
        assert result["timesteps_total"] == 4 * 256 and algo.collector.env_steps == 4 * 256
        now = ray_cluster.get([worker.pid.remote() for worker in algo.backend.workers])
        assert sum(a != b for a, b in zip(pids, now)) == 1
        algo.save()
    with (
        pytest.warns(UserWarning, match="starts new episodes"),  # the envs were in the actors
        shoal.PPO.from_checkpoint(tmp_path / "run", env=DiesOnce) as resumed,
    ):
        assert resumed.timesteps_total == 4 * 256
        assert resumed.train()["timesteps_total"] == 5 * 256
    with shoal.PPO.from_checkpoint(tmp_path / "run", env=DiesOnce, backend="local", ray_address=None) as local:
        assert local.timesteps_total == 4 * 256  # the newest checkpoint, as `shoal eval` loads it: no Ray workers
        assert local.evaluate(num_episodes=1)["episodes"] == 1


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_after_the_learner_is_checkpointed(ray_cluster, tmp_path):
    """Without recreate_failed_workers a dead actor stops the run, as a dead worker process does;
    the learner's state of the last whole iteration is saved first and the run resumes from it."""
    run = tmp_path / "run"
    config = dict(env=DiesOnce, env_config={"marker": str(tmp_path / "died"), "after": 100}, backend="ray")
    config |= dict(num_workers=2, num_envs=4, rollout_fragment_length=64, seed=2, run_dir=str(run), verbose=0)
    with shoal.PPO(**config) as algo, pytest.raises(shoal.EnvError) as caught:
        for _ in range(3):  # the first env to take its 100th step dies in the second iteration
            algo.train()
    message = str(caught.value)
    assert re.match(r"Ray rollout worker \d \(envs \d-\d of 'DiesOnce'\) died \(", message), message
    assert "; set recreate_failed_workers=True" in message
    assert message.endswith(f"iteration 1 was checkpointed first; continue with: shoal train --resume {run}")
    with (
        pytest.warns(UserWarning, match="written as a Ray worker died and holds no worker's state"),
        shoal.PPO.from_checkpoint(run, env=DiesOnce) as resumed,
    ):
        assert resumed.iteration == 1 and resumed.train()["timesteps_total"] == 2 * 256


@pytest.mark.slow
def test_ray_workers_make_failed_envs_anew_and_the_trainer_counts_them(ray_cluster, recwarn):
    crash = {"rate": 0.3, "at": 3}  # 3 in 10 episodes fail at their third step
    config = dict(env=FlakyCartPole, env_config=crash, backend="ray", num_workers=2, num_envs=4, seed=1)
    config |= dict(rollout_fragment_length=64, restart_failed_envs=True, save_outputs=False, verbose=0)
    with shoal.PPO(**config) as algo:
        result = algo.learn(10 * 256)
        episodes = list(algo.tracker.returns)
    assert 10 < result["num_env_restarts"] < 80
    warned = {str(w.message).split(")")[0] for w in recwarn if "and was made anew" in str(w.message)}
    assert len(warned) == 4  # each env's first failure, named by its id in the run
    assert len(episodes) > 20 and min(episodes) >= 8  # no episode cut at its third step (CartPole's shortest: 8)

    config |= dict(
        env_config={"rate": 1.0, "at": 3}, max_restarts_per_hour=5
    )  # the workers stop a crash loop themselves
    with shoal.PPO(**config) as algo, pytest.raises(shoal.EnvError, match="more than max_restarts_per_hour=5"):
        algo.learn(10 * 256)


RECURRENT = dict(
    env="CartPoleNoVel-v1",
    model_config={"core": "lstm", "core_size": 16},
    rollout_fragment_length=32,
    bptt_horizon=8,
    sgd_minibatch_size=32,
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo, settings",
    [
        ("ppo", RECURRENT),
        ("grpo", dict(env="CartPole-v1", group_size=2, rollout_fragment_length=60, sgd_minibatch_size=64)),
        ("dqn", dict(env="CartPole-v1", rollout_fragment_length=16, learning_starts=64, timesteps_per_iteration=64)),
        ("td3", dict(env="Pendulum-v1", rollout_fragment_length=16, learning_starts=64, timesteps_per_iteration=64)),
    ],
)
def test_every_algorithm_samples_through_ray_workers(ray_cluster, algo, settings):
    common = dict(backend="ray", num_workers=2, num_envs=4, seed=3, save_outputs=False, verbose=0, tuned=False)
    with shoal.Trainer(algo=algo, **common, **settings) as trainer:
        result = trainer.train()
        if algo == "td3":  # before learning_starts the workers act uniformly at random, as a local run does
            actions = trainer.algorithm.replay.storage["action"][:, : result["timesteps_total"] // 4]  # [envs, steps]
            assert actions.std() > 0.9 and actions.abs().max() > 1.9  # uniform on [-2, 2]: std 1.15
        result = trainer.train()
        assert result["timesteps_total"] == trainer.collector.env_steps > 0
        if algo == "dqn":
            assert result["replay_size"] == result["timesteps_total"]
        if algo == "ppo":  # the workers' LSTM state at each later segment's start came back
            (states,) = trainer.algorithm.buffer.start_states
            assert all(bool(value[:, 1:].abs().sum() > 0) for value in states.values(True, True))


def test_a_worker_acts_with_the_weights_and_attributes_it_is_sent():
    """The actor's body, here in process: each sample loads the driver's weights and the attributes
    acting reads (DQN's exploration rate), and env i starts from the seed a local run gives it."""
    config = DQNConfig.build(env="CartPole-v1", num_envs=4, seed=5)
    with shoal.DQN(env="CartPole-v1", num_envs=4, seed=5, tuned=False, save_outputs=False) as local:
        policy = local.policies["default_policy"]
        worker = RolloutWorker(config, index=1, incarnation=0, first_env=2, num_envs=2)
        worker.start({"default_policy": copy.deepcopy(policy)}, local.algorithm.stored_extras())
        worker.reset(5)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1.0)
        policy.epsilon = 1.0
        rollout = local.algorithm.rollout.start_rollout()
        weights = {"default_policy": (policy.state_dict(), {"epsilon": 1.0})}
        fragment = worker.sample(weights, 0, (rollout[2:4].clone(), []), until_done=False)
        acting = worker.policies["default_policy"]
        assert acting.epsilon == 1.0
        assert all(torch.equal(a, b) for a, b in zip(acting.parameters(), policy.parameters()))
        local.collector.reset(5)
        local.collector.collect(rollout)
        assert torch.equal(fragment.storage[0]["obs"][:, 0], rollout["obs"][2:4, 0])  # envs 2 and 3 of the run
        assert fragment.steps == 2 * (rollout.batch_size[1] - 1)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(backend="ray"), "needs num_workers >= 1"),
        (dict(backend="ray", num_workers=2, async_factor=2), "async_factor=2 needs remote_worker_envs=True"),
        (dict(backend="ray", num_workers=2, vectorization_mode="sync"), "vectorization_mode='sync' is for local envs"),
        (dict(backend="local", ray_address="auto"), "ray_address='auto' is for backend='ray'"),
        (dict(backend="rey"), "backend"),
    ],
)
def test_ray_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig.build(env="CartPole-v1", **settings)


def test_ray_address_alone_chooses_the_ray_backend():
    config = PPOConfig.build(env="CartPole-v1", num_workers=2, ray_address="auto")
    assert config.backend == "ray"


def test_without_ray_installed_asking_for_it_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'shoal\[ray\]'"):
        shoal.PPO(env="CartPole-v1", backend="ray", num_workers=2, save_outputs=False)


def test_ray_workers_under_torchrun_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it
    with pytest.raises(ConfigError, match="backend='ray' under torchrun is not supported"):
        shoal.PPO(env="CartPole-v1", backend="ray", num_workers=2, save_outputs=False)


DRIVER = os.getpid()


def cartpole(config=None):
    return gym.make("CartPole-v1")


def breaks_in_workers(config):
    if os.getpid() != DRIVER:
        raise RuntimeError("no display in this worker")
    return gym.make("CartPole-v1")


@pytest.mark.slow
def test_envs_registered_in_the_driver_reach_the_workers(ray_cluster):
    shoal.register_env("my-cartpole", cartpole)
    gym.register("MyCartPole-v0", entry_point=cartpole)
    for env in ("my-cartpole", "MyCartPole-v0"):
        with shoal.PPO(
            env=env, backend="ray", num_workers=1, num_envs=2, sgd_minibatch_size=64, save_outputs=False, verbose=0
        ) as algo:
            assert algo.train()["timesteps_total"] == algo.config.train_batch_size


@pytest.mark.slow
def test_an_env_that_fails_to_build_in_a_worker_stops_the_run_with_its_error(ray_cluster):
    with pytest.raises(RuntimeError, match="no display in this worker"):
        shoal.PPO(
            env=breaks_in_workers, backend="ray", num_workers=1, num_envs=2, sgd_minibatch_size=64, save_outputs=False
        )


@pytest.mark.slow
def test_more_workers_than_the_cluster_can_place_are_refused(ray_cluster):
    with pytest.raises(ConfigError, match=r"num_workers=3 x num_cpus_per_worker=1 = 3 CPUs, and the Ray cluster has 2"):
        shoal.PPO(env="CartPole-v1", backend="ray", num_workers=3, num_envs=3, save_outputs=False)


class CountingEnv(gym.Env):
    """obs = [steps this env took in all]; episodes of 1 to 12 steps; info ``step`` = the episode's step."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(0.0, 1e9, (1,), "float32")
        self.action_space = gym.spaces.Discrete(2)
        self.count = self.t = self.length = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(1, 13))
        return torch.tensor([self.count], dtype=torch.float32).numpy(), {}

    def step(self, action):
        self.count += 1
        self.t += 1
        obs = torch.tensor([self.count], dtype=torch.float32).numpy()
        return obs, 0.0, self.t == self.length, False, {"step": self.t}


@pytest.mark.slow
def test_complete_episodes_and_info_keys_on_ray_workers(ray_cluster):
    settings = dict(num_envs=4, rollout_fragment_length=8, save_outputs=False, verbose=0, tuned=False)
    settings |= dict(batch_mode="complete_episodes", horizon=12, info_keys=["step"], sgd_minibatch_size=32)
    delivered = [[] for _ in range(4)]
    with shoal.PPO(env=CountingEnv, backend="ray", num_workers=2, **settings) as algo:
        for _ in range(4):
            result = algo.train()
            rollout = algo.algorithm.buffer.rollout[:, :-1]
            for row in range(4):
                steps = rollout["valid"][row].nonzero().squeeze(1)
                assert rollout["done"][row, steps[-1]]  # every worker's rows end at an episode end
                delivered[row] += rollout["obs"][row, steps, 0].tolist()
                expected, t = [], 0  # each step's info, from its worker: 1, 2, ... from every episode start
                for done in rollout["done"][row, steps].tolist():
                    t += 1
                    expected.append(float(t))
                    t = 0 if done else t
                assert rollout["info"][row, steps, 0].tolist() == expected
    assert all(steps == list(range(len(steps))) for steps in delivered)  # none lost, none twice
    assert 1.0 <= result["custom_metrics"]["step_mean"] <= 6.5  # means of 1..L, L at most 12


class FailsAtStep3(gym.Wrapper):
    """CartPole that raises at its third step."""

    def __init__(self, config=None):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the simulator went away")
        return self.env.step(action)


@pytest.mark.slow
def test_remote_worker_envs_step_the_same_episodes_as_in_process_envs(ray_cluster):
    settings = dict(env="CartPole-v1", backend="ray", num_workers=1, num_envs=2, save_outputs=False, verbose=0)
    settings |= dict(seed=3, sgd_minibatch_size=64, rollout_fragment_length=32)
    rollouts, results = [], []
    for remote in (False, True):
        with shoal.PPO(remote_worker_envs=remote, **settings) as algo:
            results.append(algo.train())
            rollouts.append(algo.algorithm.buffer.rollout.select("obs", "action", "reward", "done").clone())
    assert (rollouts[0] == rollouts[1]).all()  # each env an actor: the same seeds give the same steps
    assert results[0]["timesteps_total"] == results[1]["timesteps_total"] == 64
    with (
        shoal.PPO(**settings | dict(env=FailsAtStep3, remote_worker_envs=True)) as algo,
        pytest.raises(shoal.EnvError, match=r"env .* raised RuntimeError in step\(\): the simulator went away"),
    ):
        algo.train()


@pytest.mark.slow
def test_ray_workers_tell_the_replay_that_agents_take_turns(ray_cluster):
    connect_four = dict(env="pettingzoo:pettingzoo.classic.connect_four_v3", num_envs=2)
    settings = dict(backend="ray", num_workers=1, learning_starts=10**9, timesteps_per_iteration=64)
    with shoal.DQN(**connect_four, **settings, save_outputs=False, verbose=0) as algo:
        algo.train()
        replay = algo.algorithm.replay
        assert algo.algorithm.env.turn_based and replay.turns is not None and bool(replay.sampleable.any())
        rollout = algo.algorithm.rollout.rollout[:, :-1]  # the workers' rows, with where each game ended
        ended = rollout["env_done"].view(2, 2, -1)
        assert ended.any() and torch.equal(ended.all(1), rollout["done"].view(2, 2, -1).all(1))
    # what a rollout worker steps with remote_worker_envs: each env an actor, the layout from the first
    config = DQNConfig.build(**connect_four, backend="ray", num_workers=1, remote_worker_envs=True)
    remote = build_backend(config.model_copy(update={"backend": "local"}), 2)  # as a worker builds it
    try:
        assert type(remote).__name__ == "RemoteEnvBackend" and remote.turn_based
        remote.reset(0)
        batch, games = remote.recv(), 0
        for _ in range(60):
            remote.send(batch.action_mask.float().argmax(1))  # the lowest legal column: player_0 wins on move 19
            batch = remote.recv()
            done = (batch.terminated | batch.truncated).view(2, 2).all(1)
            assert torch.equal(batch.env_done, done.repeat_interleave(2))
            games += int(done.sum())
        assert games >= 2
    finally:
        remote.close()


def test_remote_worker_envs_need_ray_workers():
    with pytest.raises(ConfigError, match=r"remote_worker_envs .* needs backend='ray'"):
        shoal.PPO(env="CartPole-v1", remote_worker_envs=True, save_outputs=False)
    # the groups are inside each worker: one worker may have two
    config = PPOConfig.build(backend="ray", num_workers=1, num_envs=8, async_factor=2, remote_worker_envs=True)
    assert config.async_factor == 2
    with pytest.raises(ConfigError, match=r"each worker's 3 envs in async_factor=2 equal groups"):
        PPOConfig.build(backend="ray", num_workers=2, num_envs=6, async_factor=2, remote_worker_envs=True)


@pytest.mark.slow
def test_a_dead_env_actor_takes_its_worker_down_and_the_worker_is_replaced(ray_cluster, tmp_path):
    config = dict(env=DiesOnce, env_config={"marker": str(tmp_path / "died"), "after": 100}, backend="ray")
    config |= dict(num_workers=2, num_envs=2, rollout_fragment_length=64, sgd_minibatch_size=64, seed=2)
    config |= dict(save_outputs=False, verbose=0)
    with (
        pytest.warns(UserWarning, match=r"Ray rollout worker \d .* died"),
        shoal.PPO(**config, remote_worker_envs=True, recreate_failed_workers=True) as algo,
    ):
        for _ in range(4):  # an env actor kills itself at its 100th step, in the second iteration
            result = algo.train()
    assert (tmp_path / "died").exists()
    assert result["num_worker_restarts"] == 1 and result["timesteps_total"] == 4 * 128


def only_in(config):
    """CartPole in the process whose pid ``config`` names (the driver); elsewhere it cannot be built."""
    if os.getpid() != config["pid"]:
        raise RuntimeError("no simulator license on this machine")
    return gym.make("CartPole-v1")


@pytest.mark.slow
def test_an_env_that_cannot_be_built_in_an_env_actor_stops_the_run_with_its_error(ray_cluster):
    settings = dict(env=only_in, env_config={"pid": os.getpid()}, backend="ray", num_workers=1, num_envs=2)
    settings |= dict(sgd_minibatch_size=64)  # of the 2 x 32 steps of an iteration
    with pytest.raises(shoal.EnvError, match=r"(?s)could not start: .*no simulator license"):
        shoal.PPO(**settings, remote_worker_envs=True, save_outputs=False)
