"""``output`` on a served run: the episodes external simulators drive through the policy server
are written as they played them."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from test_serve import _train_with_client

from shoal.offline import DatasetFile, dataset_folders
from shoal.serve import PolicyClient, ServerError

pytest.importorskip("h5py")


@pytest.mark.slow
def test_the_episodes_clients_drive_are_written_as_they_played_them(tmp_path):
    played: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # each ended episode: obs, actions, rewards

    def client_loop(url, stop):
        env = gym.make("CartPole-v1")
        with PolicyClient(url) as client:
            for n in range(10_000):
                if stop.is_set():
                    return
                obs, _ = env.reset(seed=n)
                seen, actions, rewards = [obs], [], []
                try:
                    eid = client.start_episode()
                    while True:
                        action = client.get_action(eid, obs)
                        obs, reward, terminated, truncated, _ = env.step(action)
                        client.log_returns(eid, reward)
                        seen.append(obs)
                        actions.append(action)
                        rewards.append(reward)
                        if terminated or truncated:
                            break
                    client.end_episode(eid, obs, truncated=truncated and not terminated)
                except (ServerError, ConnectionError):
                    return
                played.append((np.array(seen[:-1]), np.array(actions), np.array(rewards)))

    stop = threading.Event()
    out = tmp_path / "data"
    settings = dict(env="CartPole-v1", num_envs=1, rollout_fragment_length=128, sgd_minibatch_size=64, seed=1)
    settings |= dict(total_timesteps=1024, output=str(out))
    _train_with_client(settings, client_loop, stop)
    stop.set()
    written = [ep for folder in dataset_folders(out) for ep in DatasetFile.open(folder).episodes()]
    # in the order they ended; at the end of the run the episode under way is written cut short, and
    # one the client ended may not have reached the learner
    assert len(played) >= 10 and abs(len(written) - len(played)) <= 1
    for episode, (obs, actions, rewards) in zip(written[:-1], played, strict=False):
        np.testing.assert_allclose(episode.observations[:-1], obs, rtol=0, atol=0)
        np.testing.assert_array_equal(episode.actions, actions)
        np.testing.assert_array_equal(episode.rewards, rewards)
        log_prob = episode.infos["action_log_prob"]  # one per observation: none for the final one
        assert np.isfinite(log_prob[:-1]).all() and np.isnan(log_prob[-1]) and (log_prob[:-1] < 0).all()
