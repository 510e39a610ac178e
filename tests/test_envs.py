"""The env layer: inputs accepted, the flat batch contract, autoreset, and bad env output."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.errors import EnvError
from shoal.vector import GymVectorBackend, SerialBackend, make_backend
from tests.conftest import CounterEnv


def step_all(backend, action=0):
    backend.send(torch.full((backend.num_rows,), action, dtype=torch.int64))
    return backend.recv()


def test_unknown_env_id_suggests_closest():
    with pytest.raises(EnvError, match=r"unknown env id 'CartPol-v1'\. Did you mean 'CartPole-v1'\?"):
        shoal.PPO(env="CartPol-v1", save_outputs=False)


@pytest.mark.parametrize("mode", [None, "sync", "vector_entry_point"])
def test_an_env_config_key_the_gymnasium_env_does_not_take_names_env_and_key(mode):
    with pytest.raises(EnvError, match=r"env 'CartPole-v1' cannot be made with env_config=\{'bogus': 1\}.*'bogus'"):
        shoal.PPO(env="CartPole-v1", env_config={"bogus": 1}, vectorization_mode=mode, save_outputs=False)


def test_env_inputs_id_instance_factory_registered_vector():
    assert isinstance(make_backend("CartPole-v1", 2), SerialBackend)
    inst = make_backend(gym.make("CartPole-v1"), 3)
    assert len({id(e) for e in inst.envs}) == 3
    assert make_backend(lambda: gym.make("CartPole-v1"), 2).num_rows == 2
    seen = {}

    def creator(env_config):
        seen.update(env_config)
        return CounterEnv(limit=env_config["limit"])

    shoal.register_env("counter", creator)
    b = make_backend("counter", 2, {"limit": 3})
    assert seen == {"limit": 3} and b.envs[0].limit == 3
    vec = make_backend(gym.make_vec("CartPole-v1", 4, vectorization_mode="vector_entry_point"), 4)
    assert isinstance(vec, GymVectorBackend) and vec.autoreset == "next_step"
    assert make_backend("CartPole-v1", 4, vectorization_mode="sync").autoreset == "next_step"
    with pytest.raises(EnvError, match="holds 4 envs but num_envs=2; set num_envs=4"):
        make_backend(gym.make_vec("CartPole-v1", 4), 2)


def test_structured_spaces_are_flattened():
    class DictEnv(CounterEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Dict(
                {
                    "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                    "kind": gym.spaces.Discrete(3),
                    "pair": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (1,), np.float32))),
                }
            )
            self.action_space = gym.spaces.MultiDiscrete([2, 3])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return {"pos": np.array([0.5, -0.5], np.float32), "kind": 2, "pair": (1, np.array([0.25], np.float32))}, {}

        def step(self, action):
            assert action.shape == (2,)
            return self.reset()[0], 0.0, False, False, {}

    b = make_backend(DictEnv, 2)
    b.reset(0)
    assert b.obs_spec.shape == (8,)
    assert b.batch.obs[0].tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 0.25, 0.5, -0.5]  # keys sorted: kind, pair, pos
    b.send(torch.zeros(2, 2, dtype=torch.int64))
    algo = shoal.PPO(env=DictEnv, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, save_outputs=False)
    algo.train()
    one = DictEnv().reset()[0]
    assert algo.compute_actions(one).shape == (2,)  # one MultiDiscrete action
    assert algo.compute_actions([one, one, one]).shape == (3, 2)  # a list is a batch


def test_same_step_autoreset_keeps_final_obs_for_truncation():
    b = make_backend(lambda: CounterEnv(limit=3), 2)
    b.reset(0)
    for expected in (1.0, 2.0):
        batch = step_all(b)
        assert batch.obs[:, 0].tolist() == [expected, expected]
        assert not batch.truncated.any()
    batch = step_all(b)
    assert batch.truncated.all() and not batch.terminated.any()
    assert batch.obs[:, 0].tolist() == [0.0, 0.0]  # already reset
    assert batch.final_obs[:, 0].tolist() == [3.0, 3.0]  # the true last observation


def test_next_step_backend_marks_reset_steps_invalid():
    venv = gym.vector.SyncVectorEnv([lambda: CounterEnv(limit=2)] * 2)
    b = make_backend(venv, 2)
    b.reset(0)
    flags = []
    for _ in range(5):
        batch = step_all(b)
        flags.append((batch.truncated[0].item(), batch.valid[0].item()))
    assert flags == [(False, True), (True, True), (False, False), (False, True), (True, True)]


def test_truncated_rows_bootstrap_from_value_of_final_obs():
    algo = shoal.PPO(
        env=lambda: CounterEnv(limit=3), num_envs=2, rollout_fragment_length=4, sgd_minibatch_size=8, save_outputs=False
    )
    rollout = algo.algorithm.buffer.start_rollout()
    algo.collector.collect(rollout)
    trunc = rollout["truncated"][:, :-1]
    assert trunc[:, 2].all() and trunc.sum() == 2
    kept = algo.collector.truncations  # the true last observations, for any algorithm that needs them
    assert kept.row.tolist() == [0, 1] and kept.step.tolist() == [2, 2] and kept.obs[:, 0].tolist() == [3.0, 3.0]
    algo.algorithm.bootstrap_truncations(rollout, kept)
    expected = algo.get_policy().value(torch.full((2, 1), 3.0))
    assert torch.allclose(rollout["final_value"][:, 2], expected)
    assert rollout["obs"][:, 3, 0].tolist() == [0.0, 0.0]


def test_next_step_vector_envs_bootstrap_truncations_from_the_following_obs():
    venv = gym.vector.SyncVectorEnv([lambda: CounterEnv(limit=3)] * 2)
    algo = shoal.PPO(env=venv, num_envs=2, rollout_fragment_length=6, sgd_minibatch_size=12, save_outputs=False)
    rollout = algo.algorithm.buffer.start_rollout()
    algo.collector.collect(rollout)
    assert rollout["truncated"][:, 2].all() and rollout["obs"][:, 3, 0].tolist() == [3.0, 3.0]  # the final obs
    kept = algo.collector.truncations
    assert kept.step.tolist() == [2, 2] and kept.obs[:, 0].tolist() == [3.0, 3.0]
    algo.algorithm.bootstrap_truncations(rollout, kept)
    assert torch.equal(rollout["final_value"][:, 2], rollout["value"][:, 3])


def test_wrong_observation_shape_names_env_shape_and_dtype():
    with pytest.raises(
        EnvError,
        match=r"returned an observation of shape \(3,\) and dtype float32; "
        r"its observation_space .* promises shape \(1,\)",
    ):
        shoal.PPO(env=lambda: CounterEnv(obs_shape=(3,)), save_outputs=False)

    class WrongVec(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

        def __init__(self):
            self.num_envs = 2
            self.single_observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
            self.single_action_space = gym.spaces.Discrete(2)
            self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 2)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)

        def reset(self, *, seed=None, options=None):
            return np.zeros((2, 3), np.float64), {}

    with pytest.raises(
        EnvError, match=r"returned observations of shape \(2, 3\) and dtype float64; expected shape \(2, 1\)"
    ):
        make_backend(WrongVec(), 2).reset(0)


def test_nan_reward_is_reported_with_env_and_step():
    algo = shoal.PPO(
        env=lambda: CounterEnv(reward=float("nan")),
        num_envs=2,
        rollout_fragment_length=4,
        sgd_minibatch_size=8,
        save_outputs=False,
    )
    with pytest.raises(EnvError, match=r"env .*\(env 0\) returned a non-finite reward \(nan\) at step 0"):
        algo.train()


def test_continuous_actions_clipped_for_env_stored_unclipped():
    from tests.conftest import TargetEnv

    seen = []

    class Recording(TargetEnv):
        def step(self, action):
            seen.append(np.array(action))
            return super().step(action)

    algo = shoal.PPO(
        env=Recording,
        num_envs=4,
        rollout_fragment_length=64,
        sgd_minibatch_size=256,
        log_std_init=1.5,
        save_outputs=False,
    )
    rollout = algo.algorithm.buffer.start_rollout()
    algo.collector.collect(rollout)
    stored = rollout["action"][:, :-1]
    assert stored.abs().max() > 2.0  # wide policy: some samples fall outside the Box
    assert max(np.abs(a).max() for a in seen) <= 2.0
