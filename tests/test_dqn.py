"""DQN: its targets against a hand computation, the epsilon and target schedules, action masks,
one buffer per policy, clear config errors, exact resume, and a CartPole run that learns."""

import copy
import warnings

import pytest
import torch
from tensordict import TensorDict

import shoal
from shoal.config import DQNConfig
from shoal.errors import ConfigError
from shoal.models.qpolicy import QPolicy, greedy
from tests.conftest import assert_resume_is_bit_identical, weights_of
from tests.test_multi_agent_dict import TurnsEnv
from tests.test_pettingzoo import DyingAgentsEnv

QUIET = dict(save_outputs=False, verbose=0)


class DeclaredTurnsEnv(TurnsEnv):
    turn_based = True


SMALL = dict(
    env="CartPole-v1",
    rollout_fragment_length=16,
    gradient_steps=4,
    learning_starts=64,
    timesteps_per_iteration=64,
    buffer_size=2000,
    sgd_minibatch_size=32,
    **QUIET,
)


@pytest.mark.parametrize("double_q, alpha", [(True, 0.0), (False, 0.0), (True, 0.9), (False, 0.5)])
def test_the_learner_minimizes_huber_loss_to_the_bootstrapped_target(double_q, alpha):
    """With ``advantage_learning`` alpha the target is lowered by alpha times the target network's
    action gap at s (Bellemare et al. 2016)."""
    algo = shoal.DQN(double_q=double_q, dueling=True, advantage_learning=alpha, **SMALL)
    learner = algo.algorithm.learners["default_policy"]
    policy = algo.get_policy()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # make the target network differ from the online one
        for p in learner.target.module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    batch = TensorDict(
        {
            "obs": torch.randn(8, 4, generator=generator),
            "action": torch.randint(2, (8,), generator=generator),
            "reward": torch.randn(8, generator=generator),
            "next_obs": torch.randn(8, 4, generator=generator),
            "discount": torch.tensor([0.99, 0.0, 0.9801, 0.99, 0.99, 0.0, 0.99, 0.99]),
        },
        batch_size=[8],
    )
    before = copy.deepcopy(policy)
    with torch.no_grad():
        expected = []
        for i in range(8):  # one sample at a time, the textbook way
            nxt = batch["next_obs"][i : i + 1]
            q_target = before.q_values(nxt, learner.target.module)[0]
            pick = before.q_values(nxt)[0].argmax() if double_q else q_target.argmax()
            here = before.q_values(batch["obs"][i : i + 1], learner.target.module)[0]
            gap = here.max() - here[batch["action"][i]]
            expected.append(batch["reward"][i] + batch["discount"][i] * q_target[pick] - alpha * gap)
        q = before.q_values(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    stats, td_error = learner.learn(learner.prepare(batch), None)
    torch.testing.assert_close(td_error, (q - torch.stack(expected)).abs())
    assert stats["loss"].item() == pytest.approx(torch.nn.functional.smooth_l1_loss(q, torch.stack(expected)).item())
    assert not torch.equal(weights_of(policy), weights_of(before)), "the step moved the network"


@pytest.mark.parametrize("double_q", [True, False])
def test_a_phase_drawn_at_once_is_its_minibatches_prepared_one_by_one(monkeypatch, double_q):
    """The minibatches of a phase are drawn together and prepared a chunk at a time; each equals
    the same rows gathered and prepared alone (the target network's values in one forward)."""
    algo = shoal.DQN(double_q=double_q, **SMALL)
    algo.train()
    inner, learner = algo.algorithm, algo.algorithm.learners["default_policy"]
    monkeypatch.setattr("shoal.algos.off_policy.GATHER_BYTES", 3 * 32 * inner.replay.row_bytes)  # 3 per gather
    state = inner.generator.get_state()
    minibatches = list(inner.phase_minibatches("default_policy", 7))
    assert [len(m) for m in minibatches] == [32] * 7
    inner.generator.set_state(state)
    index = inner.replay.sample(7 * 32, inner.generator).split(32)
    key = "next_q_target" if double_q else "target"
    for got, rows in zip(minibatches, index):
        alone = learner.prepare(inner.minibatch(rows, "default_policy"))
        torch.testing.assert_close(got[key], alone[key], rtol=1e-6, atol=1e-6)
        assert torch.equal(got["obs"], alone["obs"]) and torch.equal(got["action"], alone["action"])


def test_a_learner_without_prepare_is_named():
    """A replay learner written before ``prepare`` existed is refused at once, by name."""

    class OldLearner:
        def __init__(self, policy, config):
            self.optimizers = []

        def learn(self, batch, weights):
            raise AssertionError("never reached")

    class OldDQN(shoal.algos.DQNAlgorithm):
        def make_learner(self, policy_id, config):
            return OldLearner(self.policies[policy_id], config)

    with pytest.raises(TypeError, match=r"OldLearner, the learner of policy 'default_policy', has no prepare\(batch\)"):
        OldDQN(DQNConfig(env="CartPole-v1"), shoal.Trainer(algo="dqn", **SMALL).algorithm.env)


def test_dueling_heads_combine_value_and_centred_advantages():
    algo = shoal.DQN(dueling=True, **SMALL)
    policy = algo.get_policy()
    obs = torch.randn(5, 4)
    advantage, value = policy.model(obs)
    torch.testing.assert_close(policy.q_values(obs), value[:, None] + advantage - advantage.mean(1, keepdim=True))


def test_epsilon_falls_linearly_over_the_exploration_fraction():
    algo = shoal.DQN(exploration_fraction=0.5, exploration_final_eps=0.1, **SMALL)
    first = algo.train()["epsilon"]
    algo.learn(64 * 10)
    assert first > 0.99  # the last phase of the first iteration, just past the start
    assert algo.algorithm.epsilon == pytest.approx(0.1)
    assert algo.get_policy().epsilon == pytest.approx(0.1)
    fresh = shoal.DQN(exploration_fraction=0.5, exploration_final_eps=0.1, **SMALL)
    fresh.algorithm.progress = fresh.algorithm.progress_end = 0.25
    fresh.algorithm.before_phase(0.25)
    assert fresh.algorithm.epsilon == pytest.approx(1.0 - 0.5 * 0.9)


def test_target_updates_due_in_a_phase_compound():
    algo = shoal.DQN(tau=0.1, target_update_interval=4, **SMALL)
    dqn = algo.algorithm
    learner = dqn.learners["default_policy"]
    with torch.no_grad():
        for p in learner.target.module.parameters():
            p.zero_()
    dqn.timesteps = 16  # four updates due since step 0: one update with 1 - 0.9 ** 4
    dqn.after_phase(0)
    online = weights_of(algo.get_policy().model)
    torch.testing.assert_close(weights_of(learner.target.module), (1 - 0.9**4) * online)
    dqn.after_phase(16)  # none due
    torch.testing.assert_close(weights_of(learner.target.module), (1 - 0.9**4) * online)


def test_masked_actions_are_never_taken_greedy_or_random():
    q = torch.tensor([[5.0, 1.0, 0.0], [0.0, 9.0, 1.0]])
    mask = torch.tensor([[False, True, True], [True, False, True]])
    assert greedy(q, mask).tolist() == [1, 2]
    policy = QPolicy(torch.nn.Identity(), 3)
    policy.q_values = lambda obs, model=None: q.repeat(500, 1)  # type: ignore[method-assign]
    policy.epsilon = 1.0
    action, _, _ = policy.act(
        torch.zeros(1000, 1), TensorDict({}, [1000]), torch.zeros(1000, dtype=torch.bool), mask.repeat(500, 1)
    )
    legal = mask.repeat(500, 1).gather(1, action.unsqueeze(1))
    assert bool(legal.all())
    assert set(action[0::2].tolist()) == {1, 2} and set(action[1::2].tolist()) == {0, 2}


def test_advantage_learnings_gap_is_over_the_legal_actions():
    """The action gap of advantage learning is taken from the best legal action at s: an illegal
    action of higher value does not widen it."""
    algo = shoal.DQN(env="pettingzoo:pettingzoo.classic.connect_four_v3", advantage_learning=0.5, **QUIET)
    learner = algo.algorithm.learners["default_policy"]
    policy = algo.get_policy()
    generator = torch.Generator().manual_seed(1)
    obs = torch.rand(6, *algo.algorithm.env.obs_spec.shape, generator=generator).round()
    mask = torch.rand(6, 7, generator=generator) > 0.4
    mask[:, 0] = True
    batch = TensorDict(
        {"obs": obs, "action": torch.zeros(6, dtype=torch.long), "reward": torch.zeros(6), "next_obs": obs,
         "discount": torch.zeros(6), "action_mask": mask},
        batch_size=[6],
    )  # fmt: skip
    with torch.no_grad():
        q = policy.q_values(obs, learner.target.module)
        gap = q.masked_fill(~mask, -torch.inf).amax(1) - q[:, 0]
    assert not torch.allclose(gap, q.amax(1) - q[:, 0]), "an illegal action must lead somewhere, or this tests nothing"
    prepared = learner.prepare(batch.clone())
    torch.testing.assert_close(prepared["reward"], -0.5 * gap)


def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(ConfigError, match="Discrete actions; 'Pendulum-v1' acts in Box"):
        shoal.DQN(env="Pendulum-v1", **QUIET)
    with pytest.raises(ConfigError, match="central_critic feeds an actor-critic's value function"):
        shoal.DQN(env="pettingzoo:mpe2.simple_spread_v3", central_critic="team_obs", **QUIET)
    with pytest.raises(ConfigError, match="gradient_steps=0 would never learn"):
        DQNConfig.build(gradient_steps=0)
    with pytest.raises(ConfigError, match="Did you mean 'exploration_fraction'"):
        DQNConfig.build(exploration_fractoin=0.1)
    with pytest.raises(ConfigError, match=r"buffer_size=300 holds 300 steps .* try buffer_size="):
        shoal.DQN(buffer_size=300, train_freq=300, **QUIET)
    assert DQNConfig.build(train_freq=8, minibatch_size=16).rollout_fragment_length == 8
    with pytest.raises(ConfigError, match="advantage_learning"):
        DQNConfig.build(advantage_learning=1.0)


def test_a_trained_policy_that_has_not_acted_yet_waits_for_its_steps():
    """Every agent mapped to "a": "b" is trained but holds no steps, and learns nothing (it did
    not stop the run); both uniform and prioritized replay."""
    for prioritized in (False, True):
        algo = shoal.DQN(
            **{**SMALL, "env": "pettingzoo:mpe2.simple_spread_v3", "learning_starts": 0},
            policies=["a", "b"],
            policy_mapping_fn=lambda agent, episode: "a",
            prioritized_replay=prioritized,
        )
        learner = algo.train()["learner"]
        assert "a/loss" in learner and "b/loss" not in learner


def test_an_env_that_takes_turns_undeclared_is_warned_of_once_and_a_declared_or_simultaneous_one_is_not():
    """Without ``turn_based`` a replay learner cannot tell a waiting agent from one that left."""
    with pytest.warns(shoal.ShoalWarning, match="agents act in turns, but the env does not say so") as caught:
        algo = shoal.DQN(**{**SMALL, "env": TurnsEnv})
        algo.train(), algo.train()
    assert sum("agents act in turns" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", shoal.ShoalWarning)
        shoal.DQN(**{**SMALL, "env": DeclaredTurnsEnv}).train()
        shoal.DQN(**{**SMALL, "env": "pettingzoo:pettingzoo.classic.connect_four_v3"}).train()
        shoal.DQN(**{**SMALL, "env": "pettingzoo:mpe2.simple_spread_v3"}).train()
        # agents that leave mid-episode are padding until the next one starts, wherever a rollout ends
        for fragment in (1, 5, 6):
            dying = dict(num_envs=1, rollout_fragment_length=fragment, timesteps_per_iteration=30, buffer_size=200)
            shoal.DQN(env=lambda: DyingAgentsEnv(), learning_starts=10_000, **dying, **QUIET).train()


def test_each_policy_learns_from_its_own_rows():
    """Two policies on one two-agent env: each minibatch holds only steps its policy took."""
    algo = shoal.DQN(
        **{**SMALL, "env": "pettingzoo:pettingzoo.classic.connect_four_v3"}, policies=["player_0", "player_1"]
    )
    algo.train()
    replay = algo.algorithm.replay
    for owner in (0, 1):
        index = replay.sample(256, torch.Generator().manual_seed(owner), owner)
        assert bool((replay.storage["policy_id"].view(-1)[index] == owner).all())
    assert {"player_0/loss", "player_1/loss"} <= set(algo.train()["learner"])


@pytest.mark.parametrize("prioritized", [False, True])
def test_resume_with_the_buffer_is_bit_identical(tmp_path, prioritized):
    kw = dict(SMALL, seed=3, store_buffer_in_checkpoints=True, prioritized_replay=prioritized, n_step=3)
    kw.pop("save_outputs")
    keys = ("loss", "q_mean", "epsilon", "episode_reward_mean", "replay_size")
    assert_resume_is_bit_identical(shoal.DQN, kw, tmp_path, keys, iterations=5, split=3)


def test_a_stored_buffer_that_no_longer_fits_is_left_out_with_a_warning(tmp_path):
    kw = {k: v for k, v in SMALL.items() if k != "save_outputs"} | {"store_buffer_in_checkpoints": True}
    algo = shoal.DQN(run_dir=str(tmp_path / "run"), **kw)
    algo.train()
    path = algo.save()
    with pytest.warns(UserWarning, match=r"replay buffer \(1 x 2000 steps\) does not fit .*ReplayBuffer \(1 x 1000\)"):
        resumed = shoal.DQN.from_checkpoint(path, buffer_size=1000)
    assert len(resumed.algorithm.replay) == 0
    assert resumed.train()["replay_size"] == 64  # refilled from its own steps


def test_a_checkpoint_without_the_buffer_resumes_and_refills_it_before_learning(tmp_path):
    """Resumed without its buffer, a run stores ``learning_starts`` steps again before its next
    minibatch: its networks are not fitted to the few steps of a nearly empty buffer."""
    kw = {k: v for k, v in SMALL.items() if k != "save_outputs"} | {"learning_starts": 128}
    algo = shoal.DQN(run_dir=str(tmp_path / "run"), **kw)
    for _ in range(3):
        learned = algo.train()["num_gradient_steps"]
    assert learned > 0
    path = algo.save()
    assert algo.algorithm.state_dict()["replay"] is None
    resumed = shoal.DQN.from_checkpoint(path)
    assert len(resumed.algorithm.replay) == 0
    weights = [p.clone() for p in resumed.get_policy().parameters()]
    out = resumed.train()  # 64 steps stored: fewer than learning_starts
    assert out["replay_size"] == 64
    assert out["num_gradient_steps"] == learned
    assert all(torch.equal(a, b) for a, b in zip(weights, resumed.get_policy().parameters()))
    assert resumed.train()["num_gradient_steps"] == learned + 4  # the 128th step is in: one phase's 4


@pytest.mark.slow  # a learning run
def test_dqn_learns_cartpole():
    """The shipped defaults (rl-baselines3-zoo's CartPole settings) on a shortened run."""
    algo = shoal.DQN(seed=1, **QUIET)
    algo.learn(20_000)
    assert algo.evaluate(10)["episode_reward_mean"] >= 100  # random play: about 20


def test_each_policy_discounts_its_replayed_steps_by_its_own_gamma():
    """``gamma`` is a per-policy key: each policy's minibatches are discounted by its own."""
    mapping = {"agent_0": "a"}
    settings = dict(env="CartPole-v1", n_step=1, learning_starts=64, timesteps_per_iteration=128, verbose=0)
    with shoal.DQN(policies={"a": {"gamma": 0.5}, "b": {}}, policy_mapping_fn=mapping, **settings) as dqn:
        dqn.train()
        algo = dqn.algorithm
        index = algo.replay.sample(64, torch.Generator().manual_seed(0))
        for pid, gamma in (("a", 0.5), ("b", 0.99)):
            discount = algo.minibatch(index, pid)["discount"]
            assert discount.max().item() == pytest.approx(gamma) and set(discount.unique().tolist()) <= {
                0.0,
                discount.max().item(),
            }
