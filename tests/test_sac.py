"""SAC and TD3: the squashed Gaussian against torch.distributions, learning targets against per-sample
loops, the entropy coefficient's direction, TD3's delays, action scaling, config errors, exact resume,
and short runs that learn Pendulum."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

import shoal
from shoal.errors import ConfigError
from shoal.models.actors import SquashedGaussianPolicy
from tests.conftest import assert_resume_is_bit_identical, weights_of

QUIET = dict(save_outputs=False, verbose=0)
SMALL = dict(
    env="Pendulum-v1",
    learning_starts=64,
    timesteps_per_iteration=64,
    buffer_size=2000,
    sgd_minibatch_size=32,
    model_config={"hiddens": [32, 32]},
    **QUIET,
)
ALGOS = [shoal.SAC, shoal.TD3]


def _batch(rows: int, obs_dim: int, act_dim: int, generator: torch.Generator) -> TensorDict:
    """Random transitions; every third one ends its episode (discount 0)."""
    discount = torch.full((rows,), 0.99)
    discount[::3] = 0.0
    return TensorDict(
        {
            "obs": torch.randn(rows, obs_dim, generator=generator),
            "next_obs": torch.randn(rows, obs_dim, generator=generator),
            "action": 4 * torch.rand(rows, act_dim, generator=generator) - 2,  # Pendulum's bounds are +-2
            "reward": torch.randn(rows, generator=generator),
            "discount": discount,
        },
        batch_size=[rows],
    )


def test_the_squashed_gaussian_log_prob_matches_torch_distributions():
    policy = shoal.SAC(**SMALL).get_policy()
    assert isinstance(policy, SquashedGaussianPolicy)
    x = torch.randn(64, 3)
    torch.manual_seed(0)
    action, log_prob = policy.sample(x)
    mean, log_std = policy.actor(x).chunk(2, -1)
    reference = TransformedDistribution(Normal(mean, log_std.clamp(-20, 2).exp()), [TanhTransform()])
    inside = action.clamp(-1 + 1e-6, 1 - 1e-6)  # TanhTransform's inverse is atanh
    expected = reference.log_prob(inside).sum(-1)
    assert torch.allclose(log_prob, expected, atol=1e-3)
    assert action.abs().max() < 1


def test_sac_target_matches_a_per_sample_loop():
    algo = shoal.SAC(entropy_coeff=0.3, **SMALL)
    learner = algo.algorithm.learners["default_policy"]
    policy = algo.get_policy()
    batch = _batch(16, 3, 1, torch.Generator().manual_seed(1))
    alpha = torch.tensor(0.3)
    torch.manual_seed(5)
    target = learner.td_target(batch, batch["next_obs"], alpha)
    torch.manual_seed(5)
    with torch.no_grad():
        next_action, next_log_prob = policy.sample(batch["next_obs"])  # the same draws, then row by row
        for i in range(16):
            value = learner.critic.target(torch.cat([batch["next_obs"][i], next_action[i]]).unsqueeze(0))
            soft = value.min() - alpha * next_log_prob[i]
            done = batch["discount"][i] == 0
            expected = batch["reward"][i] + (0.0 if done else batch["discount"][i] * soft)
            assert torch.allclose(target[i], expected, atol=1e-5), i


def test_td3_target_smooths_and_clips_the_target_action():
    algo = shoal.TD3(target_policy_noise=0.0, **SMALL)
    learner = algo.algorithm.learners["default_policy"]
    with torch.no_grad():  # make the target actor and critics differ from the online ones
        for p in [*learner.actor_target.module.parameters(), *learner.critic.target.module.parameters()]:
            p.add_(0.1 * torch.randn(p.shape))
    batch = _batch(16, 3, 1, torch.Generator().manual_seed(2))
    target = learner.td_target(batch, batch["next_obs"])
    with torch.no_grad():
        for i in range(16):
            a = torch.tanh(learner.actor_target.module(batch["next_obs"][i]))
            q = learner.critic.target(torch.cat([batch["next_obs"][i], a]).unsqueeze(0)).min()
            expected = batch["reward"][i] + (0.0 if batch["discount"][i] == 0 else batch["discount"][i] * q)
            assert torch.allclose(target[i], expected, atol=1e-5), i
    # with noise: each target action moves by the clipped noise, then is clamped to [-1, 1]
    learner.config.target_policy_noise, learner.config.target_noise_clip = 10.0, 0.05
    torch.manual_seed(0)
    noisy = learner.td_target(batch, batch["next_obs"])
    torch.manual_seed(0)
    noise = (torch.randn(16, 1) * 10.0).clamp(-0.05, 0.05)
    with torch.no_grad():
        for i in range(16):
            a = (torch.tanh(learner.actor_target.module(batch["next_obs"][i])) + noise[i]).clamp(-1, 1)
            q = learner.critic.target(torch.cat([batch["next_obs"][i], a]).unsqueeze(0)).min()
            expected = batch["reward"][i] + (0.0 if batch["discount"][i] == 0 else batch["discount"][i] * q)
            assert torch.allclose(noisy[i], expected, atol=1e-5), i
    assert not torch.equal(noisy, target)


def test_learned_entropy_coefficient_moves_toward_the_target_entropy():
    for target_entropy, direction in ((-5.0, -1), (5.0, 1)):
        algo = shoal.SAC(target_entropy=target_entropy, **SMALL)
        learner = algo.algorithm.learners["default_policy"]
        before = learner.log_alpha.item()
        learner.learn(_batch(32, 3, 1, torch.Generator().manual_seed(3)), None)
        assert math.copysign(1, learner.log_alpha.item() - before) == direction
    for coeff in (0.2, 0.0):
        fixed = shoal.SAC(entropy_coeff=coeff, **SMALL).algorithm.learners["default_policy"]
        fixed.learn(_batch(32, 3, 1, torch.Generator().manual_seed(3)), None)
        assert fixed.alpha().item() == pytest.approx(coeff)
        assert fixed.log_alpha is None and fixed.alpha_optimizer is None


def test_td3_steps_the_actor_and_targets_every_policy_delay_critic_steps():
    algo = shoal.TD3(policy_delay=3, **SMALL)
    learner = algo.algorithm.learners["default_policy"]
    batch = _batch(32, 3, 1, torch.Generator().manual_seed(4))
    changed = []
    for _ in range(6):
        actor, target = weights_of(learner.policy.actor), weights_of(learner.critic.target.module)
        actor_target = weights_of(learner.actor_target.module)
        learner.learn(batch, None)
        moved = not torch.equal(actor, weights_of(learner.policy.actor))
        assert moved == (not torch.equal(target, weights_of(learner.critic.target.module)))
        assert moved == (not torch.equal(actor_target, weights_of(learner.actor_target.module)))
        changed.append(moved)
    assert changed == [False, False, True, False, False, True]


def test_td3_actor_climbs_the_first_critic_not_the_minimum():
    learner = shoal.TD3(policy_delay=1, **SMALL).algorithm.learners["default_policy"]
    with torch.no_grad():  # the second critic far below the first: the minimum would follow it
        learner.critic.net.net.heads[1].bias.fill_(-100.0)
        learner.critic.net.net.heads[1].weight.mul_(5.0)
    batch = _batch(32, 3, 1, torch.Generator().manual_seed(5))
    before = [p.detach().clone() for p in learner.policy.actor.parameters()]
    learner.learn(batch, None)
    after = [p.detach().clone() for p in learner.policy.actor.parameters()]
    with torch.no_grad():  # back to the weights the actor step started from, with the critics it used
        for p, b in zip(learner.policy.actor.parameters(), before):
            p.copy_(b)
    x = learner.policy.features(batch["obs"])

    def adam_first_step(loss):  # Adam's first step: -lr * g / (|g| + eps), exactly
        grads = torch.autograd.grad(loss, list(learner.policy.actor.parameters()))
        return [-1e-3 * g / (g.abs() + 1e-8) for g in grads]

    q = learner.critic.values(x, learner.policy.critic_action(x))
    first = adam_first_step(-q[0].mean())
    q = learner.critic.values(x, learner.policy.critic_action(x))
    minimum = adam_first_step(-q.amin(0).mean())
    moved = [a - b for a, b in zip(after, before)]
    assert all(torch.allclose(m, f, atol=1e-6) for m, f in zip(moved, first))
    assert not all(torch.allclose(m, f, atol=1e-6) for m, f in zip(moved, minimum))


@pytest.mark.parametrize("algo", ALGOS)
def test_actions_stay_in_asymmetric_bounds_and_round_trip_to_unit_actions(algo):
    trainer = algo(**dict(SMALL, env="ShiftedPendulum-v0"))
    policy = trainer.get_policy()
    obs = torch.randn(500, 3)
    state, first = policy.initial_state(500), torch.ones(500, dtype=torch.bool)
    for random in (True, False):
        policy.random_actions = random
        action = policy.act(obs, state, first)[0]
        assert action.min() >= 1.0 and action.max() <= 5.0
    unit = torch.rand(50, 1) * 2 - 1
    assert torch.allclose(policy.to_unit(policy.to_env(unit)), unit, atol=1e-6)
    policy.random_actions = True  # evaluation never acts at random
    assert torch.equal(policy.act(obs, state, first, deterministic=True)[0], policy.act(obs, state, first)[0]) is False
    assert torch.equal(
        policy.act(obs, state, first, deterministic=True)[0], policy.act(obs, state, first, deterministic=True)[0]
    )


def _shifted_pendulum():
    return gym.wrappers.RescaleAction(gym.make("Pendulum-v1").unwrapped, np.float32(1.0), np.float32(5.0))


def test_config_errors_name_the_problem_and_the_fix():
    with pytest.raises(ConfigError, match="need Box actions.*algo=dqn"):
        shoal.SAC(**dict(SMALL, env="CartPole-v1"))
    with pytest.raises(ConfigError, match="model='mlp'"):
        shoal.TD3(**dict(SMALL, model="cnn"))
    with pytest.raises(ConfigError, match=r"'hiddens' and 'activation' only; got \['core'\]"):
        shoal.SAC(**dict(SMALL, model_config={"core": "lstm"}))
    with pytest.raises(ConfigError, match="policy_dely.*policy_delay"):
        shoal.TD3(policy_dely=2, **SMALL)
    with pytest.raises(ConfigError, match="entropy_coeff"):
        shoal.SAC(entropy_coeff="sometimes", **SMALL)
    with pytest.raises(ConfigError, match="infinite bounds"):
        shoal.SAC(**dict(SMALL, env="UnboundedPendulum-v0"))


def _unbounded_pendulum():
    env = gym.make("Pendulum-v1").unwrapped
    env.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    return env


def test_episode_paced_collection_is_refused_on_data_parallel_ranks():
    """Each rank's phases would end with its own episodes: different numbers of optimizer steps."""
    with shoal.TD3(**SMALL, train_freq=[1, "episode"]) as trainer:
        assert "train_freq in episodes" in trainer.algorithm.data_parallel_problem()
    with shoal.TD3(**SMALL, train_freq=1) as trainer:
        assert trainer.algorithm.data_parallel_problem() is None


def test_a_resume_steps_with_the_adam_eps_it_is_given(tmp_path):
    """The optimizers' moments come from the checkpoint, their settings from the config."""
    kw = dict(SMALL, run_dir=str(tmp_path), save_outputs=True)
    with shoal.SAC(**kw) as trainer:
        trainer.train()
        trainer.save()
    with shoal.SAC.from_checkpoint(str(tmp_path), adam_eps=1e-3, verbose=0) as resumed:
        learner = resumed.algorithm.learners["default_policy"]
        assert learner.critic.optimizer.optimizer.state  # the moments were loaded
        for optimizer in learner.optimizers:
            assert [group["eps"] for group in optimizer.optimizer.param_groups] == [1e-3]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.slow
def test_resume_with_the_buffer_is_bit_identical(tmp_path, algo):
    kw = dict(SMALL, seed=3, store_buffer_in_checkpoints=True, prioritized_replay=True, n_step=2)
    kw.pop("save_outputs")
    keys = ("critic_loss", "actor_loss", "q_mean", "episode_reward_mean", "replay_size")
    assert_resume_is_bit_identical(algo, kw, tmp_path, keys)


@pytest.mark.slow  # a learning run
@pytest.mark.parametrize(
    ("algo", "steps", "settings"), [(shoal.SAC, 3000, {"learning_rate": 1e-3}), (shoal.TD3, 5000, {"gamma": 0.98})]
)
def test_learns_pendulum(algo, steps, settings):
    trainer = algo(
        env="Pendulum-v1", seed=1, model_config={"hiddens": [64, 64]}, learning_starts=500, **settings, **QUIET
    )
    random = trainer.evaluate(10)["episode_reward_mean"]
    trainer.learn(steps)
    learned = trainer.evaluate(10)["episode_reward_mean"]
    assert learned > -800 and learned > random + 300, (random, learned)


gym.register(id="ShiftedPendulum-v0", entry_point=_shifted_pendulum, max_episode_steps=200)
gym.register(id="UnboundedPendulum-v0", entry_point=_unbounded_pendulum, max_episode_steps=200)
