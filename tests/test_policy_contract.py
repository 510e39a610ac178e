"""The policy contract: ``act(obs, state, first, action_mask) -> (action, extras, next_state)``.

A policy with per-row state (a step counter, the simplest recurrent state) shows that the
collector carries state and ``first`` flags from step to step and across rollouts, resets where
episodes start, stores the extras the algorithm declared, and does so alike on the serial,
worker-process and async backends, and in evaluation.
"""

import pytest
import torch
from tensordict import TensorDict

import shoal
from shoal.buffers import RolloutBuffer
from shoal.collect import Collector, EpisodeTracker
from shoal.collect.policies import PolicyMap
from shoal.envs.spaces import EnvInfo
from shoal.train.evaluation import run_episodes
from shoal.vector import make_backend
from tests.conftest import CounterEnv


class CountingPolicy(shoal.Policy):
    """Its state counts the steps since the row's episode started; it writes that count as its
    ``steps_seen`` extra and always takes action 0."""

    extras = ("steps_seen",)

    def initial_state(self, rows: int) -> TensorDict:
        return TensorDict({"count": torch.zeros(rows, dtype=torch.long)}, batch_size=[rows])

    def act(self, obs, state, first, action_mask=None, *, deterministic=False, out=None, critic_obs=None):
        count = torch.where(first, 0, state["count"]) + 1
        if out is None:
            out = TensorDict({"steps_seen": count.float()}, batch_size=[len(obs)])
        else:
            out.get("steps_seen").copy_(count)
        return torch.zeros(len(obs), dtype=torch.long), out, TensorDict({"count": count}, batch_size=[len(obs)])


def _collector(backend):
    policies = PolicyMap({"default_policy": CountingPolicy()}, None, ["agent_0"], backend.num_envs)
    tracker = EpisodeTracker(backend.num_rows, 100)
    env = EnvInfo("counter", backend.obs_spec, backend.act_spec, backend.num_envs, 1)
    storage = RolloutBuffer(env, 5, {"steps_seen": ((), torch.float32)})
    collector = Collector(backend, policies, tracker, ("steps_seen",))
    collector.reset(0)
    return collector, storage.rollout


@pytest.mark.parametrize("workers,async_factor", [(0, 1), (2, 1), (2, 2)], ids=["serial", "workers", "async"])
def test_state_is_carried_across_steps_and_rollouts_and_reset_where_episodes_start(workers, async_factor):
    backend = make_backend(lambda: CounterEnv(limit=3), 4, num_workers=workers, async_factor=async_factor)
    collector, rollout = _collector(backend)
    try:
        for _ in range(3):  # 15 steps: episodes of 3 cross every rollout boundary
            collector.collect(rollout)
            # a CounterEnv observes the steps taken in its episode, so the policy's count is obs + 1,
            # also on the step after the one that ended an episode and in the bootstrap slot T
            assert torch.equal(rollout["steps_seen"], rollout["obs"][..., 0] + 1)
            assert rollout["truncated"][:, :-1].sum() > 0
    finally:
        backend.close()


def test_next_step_backends_start_the_episode_after_the_reset_step():
    import gymnasium as gym

    backend = make_backend(gym.vector.SyncVectorEnv([lambda: CounterEnv(limit=3)] * 2), 2)
    collector, rollout = _collector(backend)
    collector.collect(rollout)
    # obs 1, 2, 3 (the final obs, acted on but its action ignored), then the reset step's obs 0
    assert rollout["obs"][0, :, 0].tolist() == [0, 1, 2, 3, 0, 1]
    assert rollout["steps_seen"][0].tolist() == [1, 2, 3, 4, 1, 2]


def test_evaluation_hands_first_flags_to_the_policy():
    backend = make_backend(lambda: CounterEnv(limit=4), 3)
    policy = CountingPolicy()
    state = policy.initial_state(3)
    seen = []

    def act(obs, action_mask, first):
        nonlocal state
        action, extras, state = policy.act(obs, state, first, action_mask)
        seen.append(extras["steps_seen"].tolist())
        return action

    out = run_episodes(backend, act, seed=0)
    assert out["episode_len_mean"] == 4 and seen == [[1.0] * 3, [2.0] * 3, [3.0] * 3, [4.0] * 3]


def test_extras_the_policy_does_not_fill_are_an_error_naming_them():
    backend = make_backend(lambda: CounterEnv(limit=3), 2)
    policies = PolicyMap({"default_policy": CountingPolicy()}, None, ["agent_0"], 2)
    with pytest.raises(shoal.ConfigError, match=r"policy 'default_policy' \(CountingPolicy\) does not give the "
                                                r"per-step fields \['value'\].*fills \['steps_seen'\]"):
        Collector(backend, policies, EpisodeTracker(2, 10), ("steps_seen", "value"))
