"""gSDE: the action noise is each row's features times its own matrix, held and redrawn as
configured; log-probabilities and entropies against torch's Normal with the reference variance
``(f^2) @ (std^2)``; the noise has that variance; clear config errors; PPO learns with it."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import shoal
from shoal.envs.spaces import action_spec
from shoal.errors import ConfigError
from shoal.models.actors import SDESquashedGaussianPolicy
from shoal.models.distributions import DiagGaussian
from shoal.models.networks import MLPModel
from shoal.models.sde import VARIANCE_FLOOR, SDEActorCriticPolicy, sde_log_scale
from tests.conftest import assert_resume_is_bit_identical

QUIET = dict(save_outputs=False, verbose=0)
OBS, ACT, HIDDEN = 3, 2, 8


def make_policy(sample_freq: int = -1, log_std_init: float = -0.5) -> SDEActorCriticPolicy:
    torch.manual_seed(0)
    spec = action_spec(gym.spaces.Box(-1.0, 1.0, (ACT,)))
    model = MLPModel(OBS, ACT, [HIDDEN, HIDDEN])
    policy = SDEActorCriticPolicy(model, spec, HIDDEN, log_std_init=log_std_init, sample_freq=sample_freq)
    with torch.no_grad():  # a std matrix that differs per entry, so a wrong index shows
        policy.sde.log_std.add_(torch.linspace(-0.3, 0.3, HIDDEN * ACT).view(HIDDEN, ACT))
    return policy


def reference_normal(policy: SDEActorCriticPolicy, obs: torch.Tensor) -> torch.distributions.Normal:
    """The action's distribution given the features, written from the paper's formula."""
    mean, _, features = policy.forward_features(obs)
    variance = features.square() @ policy.sde.log_std.exp().square()
    return torch.distributions.Normal(mean, (variance + VARIANCE_FLOOR).sqrt())


def act(policy, obs, state, deterministic=False):
    out = TensorDict({"sample_log_prob": torch.zeros(len(obs)), "value": torch.zeros(len(obs))}, [len(obs)])
    with torch.no_grad():
        action, extras, _ = policy.act(
            obs, state, torch.zeros(len(obs), dtype=torch.bool), out=out, deterministic=deterministic
        )
    return action, extras


def test_log_prob_and_entropy_match_the_reference_normal():
    policy = make_policy()
    obs, action = torch.randn(16, OBS), torch.randn(16, ACT)
    logp, entropy, value = policy.evaluate(obs, action)
    normal = reference_normal(policy, obs)
    torch.testing.assert_close(logp, normal.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    torch.testing.assert_close(value, policy(obs)[1])


def test_the_learner_holds_the_features_constant_but_learns_the_std():
    policy = make_policy()
    obs, action = torch.randn(16, OBS), torch.randn(16, ACT)
    hidden = policy.model.weights[0]  # the first hidden layer: reaches the loss through the mean and the features

    def grad_of_log_prob(features_learn: bool) -> torch.Tensor:
        mean, _, features = policy.forward_features(obs)
        scale = sde_log_scale(features if features_learn else features.detach(), policy.sde.log_std)
        return torch.autograd.grad(DiagGaussian.log_prob_entropy(mean, scale, action, False)[0].sum(), hidden)[0]

    logp = policy.evaluate(obs, action)[0].sum()
    got, std_grad = torch.autograd.grad(logp, [hidden, policy.sde.log_std])
    torch.testing.assert_close(got, grad_of_log_prob(features_learn=False))
    assert not torch.allclose(got, grad_of_log_prob(features_learn=True))
    assert std_grad.abs().sum() > 0


def test_act_adds_each_rows_features_times_its_matrix_with_the_reference_log_prob():
    policy = make_policy()
    obs = torch.randn(5, OBS)
    state = policy.initial_state(5)
    policy.start_collection()
    action, extras = act(policy, obs, state)
    mean, _, features = policy.forward_features(obs)
    matrices = state["sde_noise"].view(5, HIDDEN, ACT)
    torch.testing.assert_close(action, mean + torch.einsum("bf,bfa->ba", features, matrices))
    torch.testing.assert_close(extras["sample_log_prob"], reference_normal(policy, obs).log_prob(action).sum(-1))
    assert len({tuple(m.flatten().tolist()) for m in matrices}) == 5  # every row draws its own


def test_matrices_are_held_for_sample_freq_steps_and_redrawn_at_each_collection():
    policy = make_policy(sample_freq=3)
    obs = torch.randn(4, OBS)
    state = policy.initial_state(4)
    policy.start_collection()
    drawn = []
    for _ in range(7):
        act(policy, obs, state)
        drawn.append(state["sde_noise"].clone())
    assert torch.equal(drawn[0], drawn[1]) and torch.equal(drawn[1], drawn[2])
    assert not torch.equal(drawn[2], drawn[3]) and torch.equal(drawn[3], drawn[5])
    assert not torch.equal(drawn[5], drawn[6])
    action, _ = act(policy, obs, state, deterministic=True)  # the mean; the matrices stay
    torch.testing.assert_close(action, policy(obs)[0])
    assert torch.equal(state["sde_noise"], drawn[6])
    policy.start_collection()  # a new collection: every row draws at its next noisy step
    act(policy, obs, state)
    assert not (state["sde_noise"] == drawn[6]).all(1).any()


def test_once_per_collection_when_sample_freq_is_minus_one():
    policy = make_policy(sample_freq=-1)
    obs, state = torch.randn(2, OBS), policy.initial_state(2)
    policy.start_collection()
    act(policy, obs, state)
    first = state["sde_noise"].clone()
    for _ in range(50):
        act(policy, obs, state)
    assert torch.equal(state["sde_noise"], first)


def test_the_noise_has_the_variance_the_log_prob_assumes():
    policy = make_policy(sample_freq=1)
    obs = torch.randn(1, OBS).expand(20_000, OBS)
    state = policy.initial_state(20_000)
    policy.start_collection()
    action, _ = act(policy, obs, state)
    expected = reference_normal(policy, obs[:1]).scale.square()[0]
    observed = (action - policy(obs[:1])[0]).var(0)
    torch.testing.assert_close(observed, expected, rtol=0.05, atol=0.0)


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="use_sde=True explores Box actions; 'CartPole-v1' acts in Discrete"):
        shoal.PPO(env="CartPole-v1", use_sde=True, **QUIET)
    with pytest.raises(ConfigError, match="use_sde=True reads the actor's last hidden layer"):
        shoal.PPO(
            env="Pendulum-v1", use_sde=True, model_config={"core": "lstm"}, tuned=False, kind_defaults=False, **QUIET
        )
    with pytest.raises(ConfigError, match="sde_sample_freq"):
        shoal.PPOConfig.build(sde_sample_freq=-2)
    with pytest.warns(shoal.ShoalWarning, match="sde_sample_freq=4 has no effect without use_sde=true"):
        shoal.SACConfig.build(sde_sample_freq=4)
    with pytest.raises(ConfigError, match="use_sde=True is an exploration method .* CQL learns from a dataset"):
        shoal.CQLConfig.build(use_sde=True)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_resumed_gsde_run_draws_as_an_unbroken_one(tmp_path, algo):
    """The collection count and each row's matrix come back with the checkpoint: resumed after one
    collection, a run that forgot the count would count that one again and keep the stale matrices."""
    kw = dict(env="Pendulum-v1", use_sde=True, sde_sample_freq=3, seed=3, tuned=False, kind_defaults=False, verbose=0)
    if algo == "ppo":
        kw |= dict(num_envs=2, rollout_fragment_length=32, sgd_minibatch_size=32)
        keys = ("policy_loss", "entropy")
        trainer = shoal.PPO
    else:
        kw |= dict(learning_starts=32, timesteps_per_iteration=32, train_freq=8, buffer_size=512)
        kw |= dict(store_buffer_in_checkpoints=True)
        keys = ("critic_loss", "entropy")
        trainer = shoal.SAC
    assert_resume_is_bit_identical(trainer, kw, tmp_path, keys, iterations=3, split=1)


def test_each_policy_draws_matrices_for_its_own_rows_of_a_multi_agent_env():
    """Two policies on two-agent envs: the several-policy path acts on index copies of the state
    and writes them back, so each policy's table holds matrices for its own rows only, and every
    collection draws them anew."""
    algo = shoal.PPO(
        env="pettingzoo:mpe2.simple_spread_v3",
        env_config={"continuous_actions": True, "N": 2},
        policies=["agent_0", "agent_1"],
        use_sde=True,
        num_envs=2,
        rollout_fragment_length=16,
        sgd_minibatch_size=16,
        tuned=False,
        kind_defaults=False,
        **QUIET,
    )
    tables = algo.collector.policies.states
    algo.train()
    first = [table["sde_noise"].clone() for table in tables]
    algo.train()
    for p, (table, before) in enumerate(zip(tables, first)):
        mine = torch.arange(4) % 2 == p  # env-major rows: agent_0, agent_1 of env 0, then of env 1
        assert bool((before[mine] != 0).all()) and bool((before[~mine] == 0).all())
        assert not (table["sde_noise"][mine] == before[mine]).all(1).any()


def test_ppo_with_gsde_learns_on_autograd_and_moves_the_std_matrix():
    algo = shoal.PPO(
        env="Pendulum-v1",
        use_sde=True,
        sde_sample_freq=4,
        num_envs=2,
        rollout_fragment_length=64,
        sgd_minibatch_size=64,
        tuned=False,
        kind_defaults=False,
        **QUIET,
    )
    policy = algo.get_policy()
    assert isinstance(policy, SDEActorCriticPolicy) and not hasattr(policy, "log_std")
    before = policy.sde.log_std.detach().clone()
    result = algo.train()
    assert math.isfinite(result["policy_loss"]) and not torch.equal(before, policy.sde.log_std.detach())
    assert type(algo.algorithm.learners["default_policy"].optimizer).__name__ == "AutogradOptimizer"


@pytest.mark.slow
def test_gsde_rows_hold_their_own_matrices_on_ray_workers_and_draw_anew_each_collection(ray_cluster):
    """PPO with gSDE on two Ray workers, its weights held still (a step size of 1e-30): the noise
    of each stored action is its features times one matrix per row through the whole collection
    (an exact least-squares fit over the row's 32 steps), the matrices differ between rows, and
    the next collection draws new ones: each row's noise state travels with the worker."""
    settings = dict(env="Pendulum-v1", use_sde=True, sde_sample_freq=-1, model_config={"hiddens": [2]})
    common = dict(
        backend="ray",
        num_workers=2,
        num_envs=4,
        seed=3,
        save_outputs=False,
        verbose=0,
        tuned=False,
        kind_defaults=False,
    )
    with shoal.Trainer(
        algo="ppo", learning_rate=1e-30, rollout_fragment_length=32, sgd_minibatch_size=64, **settings, **common
    ) as trainer:
        policy = trainer.algorithm.policies["default_policy"]
        fits = []
        for _ in range(2):
            trainer.train()
            rollout = trainer.algorithm.buffer.rollout[:, :-1]
            with torch.no_grad():
                mean, _, features = policy.forward_features(rollout["obs"].flatten(0, 1))
            noise = (rollout["action"].flatten(0, 1) - mean).view(4, 32, -1)
            features = features.view(4, 32, -1)
            matrices = torch.linalg.lstsq(features, noise).solution  # [rows, features, act]
            torch.testing.assert_close(features @ matrices, noise, atol=1e-4, rtol=1e-4)
            fits.append(matrices)
        assert all(not torch.allclose(fits[0][i], fits[0][j]) for i in range(4) for j in range(i))
        assert not torch.allclose(fits[0], fits[1], atol=1e-3)


# ----- SAC ----------------------------------------------------------------------------------------
def sac_policy():
    small = dict(learning_starts=32, timesteps_per_iteration=64, buffer_size=512, sgd_minibatch_size=32)
    algo = shoal.SAC(
        env="Pendulum-v1",
        use_sde=True,
        log_std_init=-1.0,
        sde_sample_freq=2,
        tuned=False,
        kind_defaults=False,
        **small,
        **QUIET,
    )
    policy = algo.get_policy()
    assert isinstance(policy, SDESquashedGaussianPolicy)
    return algo, policy


def test_sac_samples_with_the_reference_squashed_log_prob_and_learns_std_and_features():
    _, policy = sac_policy()
    x = torch.randn(32, 3)
    torch.manual_seed(5)
    unit, logp = policy.sample(x)
    torch.manual_seed(5)
    matrix = torch.randn_like(policy.sde.log_std) * policy.sde.log_std.exp()
    mean, features = policy.mean_and_features(x)
    variance = features.square() @ policy.sde.log_std.exp().square()
    pre_tanh = mean + features @ matrix
    normal = torch.distributions.Normal(mean, (variance + VARIANCE_FLOOR).sqrt())
    expected = normal.log_prob(pre_tanh).sum(-1) - torch.log1p(-torch.tanh(pre_tanh).square()).sum(-1)
    torch.testing.assert_close(unit, torch.tanh(pre_tanh))
    torch.testing.assert_close(logp, expected, rtol=1e-4, atol=1e-4)
    logp.sum().backward()
    assert policy.sde.log_std.grad.abs().sum() > 0 and policy.actor[0].weight.grad.abs().sum() > 0


def test_sac_collects_with_each_rows_held_matrix_and_evaluates_on_the_mean():
    _, policy = sac_policy()
    obs = torch.randn(3, 3)
    state = policy.initial_state(3)
    policy.start_collection()
    with torch.no_grad():
        action, _, _ = policy.act(obs, state, torch.zeros(3, dtype=torch.bool))
        mean, features = policy.mean_and_features(policy.features(obs))
        matrices = state["sde_noise"].view(3, *policy.sde.log_std.shape)
        unit = torch.tanh(mean + torch.einsum("bf,bfa->ba", features, matrices))
        torch.testing.assert_close(action, policy.to_env(unit))
        greedy, _, _ = policy.act(obs, state, torch.zeros(3, dtype=torch.bool), deterministic=True)
        torch.testing.assert_close(greedy, policy.to_env(torch.tanh(mean)))


def test_sac_with_gsde_trains_and_td3_has_no_such_key():
    algo, _ = sac_policy()
    assert math.isfinite(algo.train()["critic_loss"])
    # without log_std_init, SAC's std matrix starts at Stable-Baselines3's SAC default, exp(-3)
    plain = shoal.SAC(env="Pendulum-v1", use_sde=True, tuned=False, kind_defaults=False, **QUIET).get_policy()
    assert isinstance(plain, SDESquashedGaussianPolicy)
    assert bool((plain.sde.log_std == -3.0).all())
    with pytest.raises(ConfigError, match="use_sde"):
        shoal.TD3(env="Pendulum-v1", use_sde=True, **QUIET)


def test_each_served_episode_draws_its_own_noise_matrix():
    """The policy server's episodes reuse rows, and it runs no collections: a new episode on a row
    must not act with the matrix the row's last episode drew."""
    from shoal.serve.inference import InferenceSession

    algo, policy = sac_policy()
    session = InferenceSession(policy, algo.backend, max_episodes=1, deterministic=False)
    try:
        obs = np.array([1.0, 0.0, 0.0], np.float32)
        matrices = []
        for _ in range(2):
            episode = session.start_episode()
            session.get_action(episode, obs)
            matrices.append(session.state["sde_noise"][0].clone())
            session.end_episode(episode, obs)
        assert not torch.equal(*matrices)
    finally:
        session.close()


# ----- Ornstein-Uhlenbeck noise of the deterministic actors ---------------------------------------
def test_ornstein_uhlenbeck_noise_follows_the_reference_recursion_and_restarts_with_each_episode():
    algo = shoal.TD3(
        env="Pendulum-v1",
        noise_type="ornstein-uhlenbeck",
        exploration_noise=0.5,
        model_config={"hiddens": [4]},
        **QUIET,
    )
    policy = algo.get_policy()
    obs, rows = torch.randn(4, 3), 4
    state = policy.initial_state(rows)
    with torch.no_grad():
        mean = policy.mean_action(policy.features(obs))
    theta, dt, sigma = 0.15, 0.01, 0.5
    x = torch.zeros(rows, 1)
    first = torch.zeros(rows, dtype=torch.bool)
    for step in range(30):
        first = torch.tensor([step == 10, False, step == 20, False])
        torch.manual_seed(step)
        with torch.no_grad():
            action, _, _ = policy.act(obs, state, first)
        torch.manual_seed(step)
        x = torch.where(first.unsqueeze(1), 0.0, x)  # the slow reference: one row at a time would read the same
        x = x - theta * x * dt + sigma * dt**0.5 * torch.randn_like(x)
        torch.testing.assert_close(action, policy.to_env((mean + x).clamp(-1, 1)))
    with torch.no_grad():  # evaluation: the mean, the processes left as they were
        greedy, _, _ = policy.act(obs, state, first, deterministic=True)
    torch.testing.assert_close(greedy, policy.to_env(mean))
    torch.testing.assert_close(state["ou_noise"], x)


def test_ornstein_uhlenbeck_noise_is_correlated_and_has_the_stationary_spread():
    algo = shoal.TD3(
        env="Pendulum-v1",
        noise_type="ornstein-uhlenbeck",
        exploration_noise=0.5,
        model_config={"hiddens": [4]},
        **QUIET,
    )
    policy = algo.get_policy()
    rows = 4000
    state, obs = policy.initial_state(rows), torch.zeros(rows, 3)
    policy.actor[-1].weight.data.zero_()  # a mean action of tanh(bias): the noise shows alone
    policy.actor[-1].bias.data.zero_()
    first = torch.zeros(rows, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(2000):  # 3 time constants of 1 / (theta * dt) = 667 steps
            policy.act(obs, state, first)
        before = state["ou_noise"].clone()
        policy.act(obs, state, first)
    stationary = 0.5 / (2 * 0.15) ** 0.5 * (1 - (1 - 0.15 * 0.01) ** 4000) ** 0.5
    assert abs(float(before.std()) - stationary) < 0.05 * stationary
    assert float(torch.corrcoef(torch.stack([before[:, 0], state["ou_noise"][:, 0]]))[0, 1]) > 0.99
