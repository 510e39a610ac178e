"""MADDPG: the straight-through Gumbel-Softmax, teams gathered from the replay rows, the centralized
target against a per-sample loop, frozen critics, config errors, exact resume, and a short run on
mpe2's simple_spread that learns."""

import warnings

import gymnasium as gym
import pytest
import torch

import shoal
from shoal.algos.critics import Critics
from shoal.errors import ConfigError
from shoal.models.actors import GumbelSoftmaxPolicy, QTowers
from tests.conftest import assert_resume_is_bit_identical
from tests.test_sequence_replay import MaskedPair

SPREAD = dict(env="pettingzoo:mpe2.simple_spread_v3", env_config={"max_cycles": 25})
QUIET = dict(save_outputs=False, verbose=0)
SMALL = dict(
    **SPREAD,
    num_envs=2,
    learning_starts=100,
    timesteps_per_iteration=100,
    gradient_steps=2,
    buffer_size=3000,
    sgd_minibatch_size=32,
    **QUIET,
)


def test_straight_through_gumbel_softmax_is_one_hot_forward_and_relaxed_backward():
    actor = torch.nn.Linear(4, 5)
    policy = GumbelSoftmaxPolicy(actor, 5, None, temperature=0.7)
    x = torch.randn(64, 4)
    torch.manual_seed(0)
    action = policy.critic_action(x)
    assert torch.equal(action.sum(1), torch.ones(64)) and set(action.unique().tolist()) <= {0.0, 1.0}
    weights = torch.randn(64, 5)
    (action * weights).sum().backward()
    straight = actor.weight.grad.clone()
    actor.zero_grad()
    torch.manual_seed(0)  # the same Gumbel draws, through the relaxed sample only
    gumbel = -torch.empty(64, 5).exponential_().log_()
    soft = ((actor(x) + gumbel) / 0.7).softmax(-1)
    assert torch.equal(action.argmax(1), soft.argmax(1))
    (soft * weights).sum().backward()
    assert torch.allclose(straight, actor.weight.grad, atol=1e-6)


def test_acting_samples_the_categorical_and_deterministic_takes_the_argmax():
    actor = torch.nn.Linear(1, 3)
    with torch.no_grad():
        actor.weight.zero_()
        actor.bias.copy_(torch.tensor([0.0, 1.0, 2.0]).log())  # probabilities 0, 1/3, 2/3
    policy = GumbelSoftmaxPolicy(actor, 3, None, temperature=1.0)
    obs, state, first = torch.zeros(30_000, 1), policy.initial_state(30_000), torch.ones(30_000, dtype=torch.bool)
    counts = torch.bincount(policy.act(obs, state, first)[0], minlength=3).float() / 30_000
    assert counts[0] == 0 and abs(counts[1] - 1 / 3) < 0.015 and abs(counts[2] - 2 / 3) < 0.015
    assert policy.act(obs, state, first, deterministic=True)[0].eq(2).all()


def test_a_minibatch_holds_each_sampled_step_with_its_whole_team():
    trainer = shoal.MADDPG(seed=0, **SMALL)
    trainer.train()
    algo = trainer.algorithm
    index = algo.replay.sample(16, torch.Generator().manual_seed(1))
    batch = algo.minibatch(index, "default_policy")
    columns, agents = algo.replay.columns, 3
    row, col = index // columns, index % columns
    assert torch.equal(batch["slot"], row % agents)
    storage = algo.replay.storage
    for b in range(16):
        for j in range(agents):
            assert torch.equal(batch["team"]["obs"][b, j], storage["obs"][row[b] - row[b] % agents + j, col[b]])
    own = batch["team"][torch.arange(16), batch["slot"]]
    assert torch.equal(own["obs"], storage.view(-1)["obs"][index])


def test_the_centralized_target_matches_a_per_sample_loop():
    trainer = shoal.MADDPG(seed=0, **dict(SMALL, env_config={"max_cycles": 25, "continuous_actions": True}))
    trainer.train()
    algo = trainer.algorithm
    learner = algo.learners["default_policy"]
    with torch.no_grad():  # make the targets differ from the online networks
        for p in [*learner.actor_target.module.parameters(), *learner.critic.target.module.parameters()]:
            p.add_(0.1 * torch.randn(p.shape))
    batch = algo.minibatch(algo.replay.sample(8, torch.Generator().manual_seed(2)), "default_policy")
    batch["team"]["discount"][0] = 0.0  # one terminal step: nothing bootstrapped
    target = learner.td_target(batch)
    team = batch["team"]
    with torch.no_grad():
        for b in range(8):
            s = int(batch["slot"][b])
            actions = [torch.tanh(learner.actor_target.module(team["next_obs"][b, j])) for j in range(3)]
            critic_in = torch.cat([*team["next_obs"][b], torch.nn.functional.one_hot(torch.tensor(s), 3), *actions])
            value = learner.critic.target(critic_in.unsqueeze(0))[0, 0]
            discount = team["discount"][b, s]
            expected = team["reward"][b, s] + (0.0 if discount == 0 else discount * value)
            assert torch.allclose(target[b], expected, atol=1e-5), b


def test_frozen_critics_pass_gradients_to_the_actions_only():
    critics = Critics(QTowers(6, [8], 2), shoal.SACConfig())
    action = torch.randn(4, 2, requires_grad=True)
    with critics.frozen():
        critics.values(torch.randn(4, 4), action).sum().backward()
    assert action.grad is not None and action.grad.abs().sum() > 0
    assert all(p.grad is None for p in critics.net.parameters())
    assert all(p.requires_grad for p in critics.net.parameters())


def test_config_errors_name_the_problem_and_the_fix():
    with pytest.raises(ConfigError, match="Discrete or Box"):
        shoal.MADDPG(env=MultiDiscreteEnv(), **QUIET)
    with pytest.raises(ConfigError, match="connect_four_v3' is turn-based: one agent moves at a time"):
        shoal.MADDPG(env="pettingzoo:pettingzoo.classic.connect_four_v3", **QUIET)
    with pytest.raises(ConfigError, match="action masks"):
        shoal.MADDPG(env=MaskedPair, **QUIET)
    with pytest.raises(ConfigError, match="model='mlp'"):
        shoal.MADDPG(**dict(SMALL, model="cnn"))
    with pytest.raises(ConfigError, match="gumbel_temprature.*gumbel_temperature"):
        shoal.MADDPG(gumbel_temprature=0.5, **SMALL)


def test_noise_settings_for_discrete_actors_are_warned_of_as_unread():
    unread = "exploration_noise, noise_type set for MADDPG on .* Discrete: .* the noise settings are not read"
    with pytest.warns(shoal.ShoalWarning, match=unread):
        shoal.MADDPG(exploration_noise=0.3, policies={"p": {"noise_type": "ornstein-uhlenbeck"}}, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error", shoal.ShoalWarning)
        shoal.MADDPG(**SMALL)  # the defaults
        shoal.MADDPG(policies={"p": {"gamma": 0.9}}, **SMALL)  # a policy's config is rebuilt from every key
        box = dict(SMALL, env_config={"max_cycles": 25, "continuous_actions": True})
        shoal.MADDPG(exploration_noise=0.3, **box)  # read by Box actors


class MultiDiscreteEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.MultiDiscrete([2, 2])

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_resume_with_the_buffer_is_bit_identical(tmp_path):
    # one agent (DDPG): checkpoints keep a Gymnasium env's state, not a multi-agent env's, whose
    # resumed run starts new episodes
    kw = dict(SMALL, seed=3, store_buffer_in_checkpoints=True, env="Pendulum-v1", env_config={})
    kw.pop("save_outputs")
    keys = ("critic_loss", "actor_loss", "q_mean", "episode_reward_mean", "replay_size")
    assert_resume_is_bit_identical(shoal.MADDPG, kw, tmp_path, keys)


@pytest.mark.slow  # a learning run
def test_maddpg_learns_simple_spread():
    trainer = shoal.MADDPG(**SPREAD, seed=1, learning_starts=1000, **QUIET)
    random = trainer.evaluate(20)["episode_reward_mean"]
    trainer.learn(6000)
    learned = trainer.evaluate(20)["episode_reward_mean"]
    assert learned > random + 25, (random, learned)
