"""postprocess_trajectory: the Algorithm method and the callback see each policy's steps of every
rollout, may change rewards or add fields before the learner reads them, and leave the logged
returns raw; the intrinsic-reward example finds a reward that PPO alone does not."""

import pytest
import torch

import shoal
import shoal.envs.examples  # registers SparseChain-v0
from examples.intrinsic_reward import CountBonus
from shoal.algos import PPOAlgorithm
from tests.conftest import CounterEnv

QUIET = dict(save_outputs=False, verbose=0, tuned=False)


class Recorder(shoal.Callback):
    """Doubles every reward, adds a field, and keeps what it saw."""

    def __init__(self):
        self.seen = []

    def on_postprocess_trajectory(self, trainer, trajectory):
        trajectory.rollout["reward"][:, :-1][trajectory.mask] *= 2.0
        trajectory.rollout["bonus"] = torch.ones(trajectory.rollout.batch_size)
        self.seen.append((trajectory.policy_id, trajectory.mask.clone(), trajectory.agents.batch_size))


class Halving(PPOAlgorithm):
    """The algorithm's own hook runs first: rewards halved, then the callback doubles them."""

    def postprocess_trajectory(self, trajectory):
        trajectory.rollout["reward"][:, :-1][trajectory.mask] *= 0.5
        trajectory.rollout["reward"][:, :-1][trajectory.mask] += 10.0


def test_the_method_and_the_callback_change_the_learning_rewards_only():
    recorder = Recorder()
    env = lambda: CounterEnv(limit=4)  # noqa: E731 (reward 1 per step, episodes of 4 steps)
    with shoal.Trainer(
        algo=Halving,
        env=env,
        callbacks=[recorder],
        num_envs=2,
        rollout_fragment_length=8,
        sgd_minibatch_size=16,
        **QUIET,
    ) as t:
        result = t.train()
        rollout = t.algorithm.buffer.rollout
    assert torch.equal(rollout["reward"][:, :-1], torch.full((2, 8), 21.0))  # (1 * 0.5 + 10) * 2, in that order
    assert "bonus" in rollout  # a field added by the hook stays for the learner
    assert result["episode_reward_mean"] == 4.0  # the env's own rewards
    ((policy, mask, agents),) = recorder.seen
    assert policy == "default_policy" and mask.all() and agents == (2, 1, 9)


def test_each_policy_sees_its_own_steps_and_the_other_agents_of_its_env():
    recorder = Recorder()
    ids = ["agent_0", "agent_1", "agent_2"]
    settings = dict(num_envs=2, rollout_fragment_length=10, env_config={"max_cycles": 25}, policies=ids)
    with shoal.PPO(env="pettingzoo:mpe2.simple_spread_v3", callbacks=[recorder], **settings, **QUIET) as t:
        t.train()
        valid = t.algorithm.buffer.rollout["valid"][:, :-1]
    assert [policy for policy, _, _ in recorder.seen] == ids
    masks = torch.stack([mask for _, mask, _ in recorder.seen])
    assert torch.equal(masks.sum(0), valid.long())  # each valid step belongs to exactly one policy
    assert masks[0, 0::3].all() and not masks[0, 1::3].any()  # agent_0's rows: the first of each env's three
    assert all(agents == (2, 3, 11) for _, _, agents in recorder.seen)


def test_the_callback_runs_for_replay_learners_too():
    recorder = Recorder()
    with shoal.DQN(env="CartPole-v1", callbacks=[recorder], timesteps_per_iteration=20, **QUIET) as t:
        t.train()
        phases = t.config.phases
    assert len(recorder.seen) == phases  # once per collection phase, before its steps enter the buffer


@pytest.mark.slow
def test_a_count_bonus_finds_the_far_reward_that_ppo_alone_misses():
    returns = {}
    for name, callbacks in (("plain", []), ("bonus", [CountBonus()])):
        with shoal.PPO(env="SparseChain-v0", callbacks=callbacks, seed=1, **QUIET) as algo:
            algo.learn(60_000)
            returns[name] = algo.evaluate(5)["episode_reward_mean"]
    assert returns == {"plain": pytest.approx(0.1), "bonus": 1.0}
