"""The policy contract: ``act(obs, state, first, action_mask) -> (action, extras, next_state)``.

A policy with per-row state (a step counter, the simplest recurrent state) shows that the
collector carries state and ``first`` flags from step to step and across rollouts, resets where
episodes start, stores the extras the algorithm declared, and does so alike on the serial,
worker-process and async backends, and in evaluation.
"""

import contextlib

import numpy as np
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
    agents = backend.agents or ["agent_0"]
    policies = PolicyMap({"default_policy": CountingPolicy()}, None, agents, backend.num_envs)
    tracker = EpisodeTracker(backend.num_rows, 100)
    mask = backend.batch.action_mask
    env = EnvInfo(
        "counter",
        backend.obs_spec,
        backend.act_spec,
        backend.num_envs,
        backend.rows_per_env,
        0 if mask is None else mask.shape[1],
    )
    storage = RolloutBuffer(env, 5, {"steps_seen": ((), torch.float32)})
    collector = Collector(backend, policies, tracker, ("steps_seen",))
    collector.reset(0)
    return collector, storage.rollout


@pytest.mark.parametrize(
    "workers,async_factor",
    [
        pytest.param(0, 1, id="serial"),
        pytest.param(2, 1, id="workers", marks=pytest.mark.slow),  # worker processes
        pytest.param(2, 2, id="async", marks=pytest.mark.slow),
    ],
)
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


def test_agents_that_leave_early_start_again_when_their_env_resets():
    from test_pettingzoo import DyingAgentsEnv

    # agent k leaves after k + 1 steps and the env resets after 3: a row that left is padding
    # until then, and its next episode starts with its env's, not on the step after it left
    backend = make_backend(lambda: DyingAgentsEnv(), 2)
    collector, rollout = _collector(backend)
    for _ in range(2):
        collector.collect(rollout)
        steps = rollout[:, :-1]
        valid = steps["valid"]
        assert not valid.all()  # some steps are padding
        env_time = steps["obs"][..., 1]  # every agent observes its env's step count
        assert torch.equal(steps["steps_seen"][valid], env_time[valid] + 1)
    backend.close()


def test_next_step_backends_start_the_episode_after_the_reset_step():
    import gymnasium as gym

    backend = make_backend(gym.vector.SyncVectorEnv([lambda: CounterEnv(limit=3)] * 2), 2)
    collector, rollout = _collector(backend)
    collector.collect(rollout)
    # obs 1, 2, 3 (the final obs, acted on but its action ignored), then the reset step's obs 0
    assert rollout["obs"][0, :, 0].tolist() == [0, 1, 2, 3, 0, 1]
    assert rollout["steps_seen"][0].tolist() == [1, 2, 3, 4, 1, 2]


def test_next_step_backends_map_policies_again_where_the_next_episode_starts():
    """The final observation's slot, whose value bootstraps a truncation, is acted on by the policy
    of the episode it ends, not by the next episode's (here the other policy every two episodes)."""
    import gymnasium as gym

    backend = make_backend(gym.vector.SyncVectorEnv([lambda: CounterEnv(limit=3)] * 2), 2)
    both = {"a": CountingPolicy(), "b": CountingPolicy()}
    policies = PolicyMap(both, lambda agent, episode: "ab"[episode.episode_id // 2 % 2], ["agent_0"], 2)
    env = EnvInfo("counter", backend.obs_spec, backend.act_spec, 2, 1, 0)
    rollout = RolloutBuffer(env, 9, {"steps_seen": ((), torch.float32)}).rollout
    collector = Collector(backend, policies, EpisodeTracker(2, 100), ("steps_seen",))
    collector.reset(0)
    collector.collect(rollout)
    assert rollout["obs"][0, :, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert rollout["policy_id"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]  # episodes 0, 2 and 4 on row 0
    backend.close()


def test_an_external_env_s_idle_slots_start_no_episodes():
    """A slot no client plays is padding at every step: the policy mapping is not asked again
    (a client plays slot 0 throughout, slot 1 idles)."""
    import threading

    from tests.test_external_backend import _backend

    backend = _backend(num_envs=2)

    def play():
        episode = backend.start_episode("playing")
        with contextlib.suppress(Exception):  # the backend closes under it at the end
            while True:
                backend.get_action(episode, np.zeros(3, np.float32))

    asked = []
    policies = PolicyMap(
        {"a": CountingPolicy(), "b": CountingPolicy()},
        lambda agent, episode: asked.append(episode.episode_id) or "a",
        ["agent_0"],
        2,
    )
    env = EnvInfo("sim", backend.obs_spec, backend.act_spec, 2, 1, 0)
    rollout = RolloutBuffer(env, 6, {"steps_seen": ((), torch.float32)}).rollout
    collector = Collector(backend, policies, EpisodeTracker(2, 100), ("steps_seen",))
    collector.reset(0)
    threading.Thread(target=play, daemon=True).start()
    collector.collect(rollout)
    assert rollout["valid"][0, 1:-1].all() and not rollout["valid"][1, :-1].any()
    assert asked == [0, 1]  # mapped at the reset only
    backend.close()


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
    with pytest.raises(
        shoal.ConfigError,
        match=r"policy 'default_policy' \(CountingPolicy\) does not give the "
        r"per-step fields \['value'\].*fills \['steps_seen'\]",
    ):
        Collector(backend, policies, EpisodeTracker(2, 10), ("steps_seen", "value"))


@pytest.mark.parametrize("num_policies", [1, 2])
def test_an_algorithm_may_store_a_subset_of_the_actor_critics_extras(num_policies):
    ppo = shoal.PPO(env="CartPole-v1", save_outputs=False, verbose=0)
    policy = ppo.get_policy()
    backend = make_backend("CartPole-v1", 4)
    ids = [f"p{i}" for i in range(num_policies)]
    policies = PolicyMap(
        dict.fromkeys(ids, policy), lambda agent, episode: ids[episode.env_id % len(ids)], ["agent_0"], 4
    )
    env = EnvInfo("CartPole-v1", backend.obs_spec, backend.act_spec, 4, 1)
    rollout = RolloutBuffer(env, 5, {"value": ((), torch.float32)}).rollout
    collector = Collector(backend, policies, EpisodeTracker(4, 10), ("value",))  # not sample_log_prob
    collector.reset(0)
    collector.collect(rollout)
    with torch.no_grad():
        values = policy.value(rollout["obs"].reshape(-1, 4)).reshape(4, 6)
    assert torch.allclose(rollout["value"], values, atol=1e-5)  # large batches compute tanh another way
    assert "sample_log_prob" not in rollout.keys()  # noqa: SIM118 (a TensorDict)
    backend.close()
    ppo.close()
