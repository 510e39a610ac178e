"""The learning-curve helpers the benchmark scripts share: what they time and how they read a curve."""

import time

import pytest

import shoal
from shoal.bench import held_from, learning_curve


def test_held_from_is_where_the_curve_last_reached_the_level_for_good():
    curve = [(0, 10.0), (100, 480.0), (200, 300.0), (300, 490.0), (400, 500.0)]
    assert held_from(curve, 475) == 300
    assert held_from(curve[:3], 475) is None  # below at the end
    assert held_from([(0, 500.0)], 475) == 0


class SlowEvaluation(shoal.PPO):
    """PPO whose every evaluation takes a second and scores the env steps so far."""

    def evaluate(self, num_episodes=None, *args, **kwargs):
        time.sleep(1.0)
        return {"episode_reward_mean": float(self.timesteps_total), "episode_reward_min": 0.0}


@pytest.mark.slow
def test_learning_curve_times_the_training_alone():
    """Four evaluations of a second each (at the start, two along the way, at the end) against
    a training of well under a second: none of them may count in the wall time, nor be taken
    out of it twice."""
    settings = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, num_sgd_iter=1, seed=0)
    out = learning_curve(SlowEvaluation, settings, 1024, 512, level=600)
    assert [steps for steps, _ in out["curve"]] == [0, 512, 1024, 1024]
    assert 0.0 < out["wall"] < 1.0, out["wall"]
    assert out["steps"] == 1024 and out["first"] == 1024 and out["held"] == 1024
