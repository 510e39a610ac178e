"""PQN: its Q(lambda) returns against a slow reference loop (property-based), the greedy value the
policy stores, its loss against a hand computation, masks, several policies, clear config errors,
exact resume, and CartPole learnt at its tuned budget."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given
from tensordict import TensorDict
from test_advantages import slow_folded_gae
from test_properties_math import TORCH, assert_close, gae_cases, pattern_case

import shoal
from shoal.algos.base import Statistics
from shoal.algos.on_policy import Minibatch
from shoal.algos.pqn import PQNAlgorithm
from shoal.algos.returns import q_lambda_returns
from shoal.config import PQNConfig
from shoal.errors import ConfigError
from shoal.models.encoders import ChannelNorm
from shoal.models.qpolicy import QPolicy
from tests.conftest import assert_resume_is_bit_identical

pytestmark = pytest.mark.usefixtures("no_flush_denormal")
QUIET = dict(save_outputs=False, verbose=0)
SMALL = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=16, sgd_minibatch_size=32, **QUIET)


def slow_q_lambda(reward, q_max, terminated, truncated, final_q_max, gamma, lam) -> np.ndarray:
    """PQN's recursion, step by step from the end of each row: a terminal step's return is its
    reward, a truncated one's bootstraps from the final observation's greedy value, any other mixes
    the next greedy value and the next return; past the last step stands the last greedy value."""
    n, t = reward.shape
    out = np.zeros((n, t))
    for row in range(n):
        later = q_max[row, t]
        for step in reversed(range(t)):
            if terminated[row, step]:
                later = reward[row, step]
            elif truncated[row, step]:
                later = reward[row, step] + gamma * final_q_max[row, step]
            else:
                later = reward[row, step] + gamma * ((1 - lam) * q_max[row, step + 1] + lam * later)
            out[row, step] = later
    return out


def run_q_lambda(case: dict[str, Any], valid: np.ndarray | None = None) -> torch.Tensor:
    def f(key):
        return torch.tensor(case[key], dtype=case["dtype"])

    return q_lambda_returns(
        f("reward"),
        f("value"),
        torch.tensor(case["terminated"]),
        torch.tensor(case["truncated"]),
        f("final_value"),
        gamma=case["gamma"],
        q_lambda=case["lam"],
        valid_t=None if valid is None else torch.tensor(valid),
    )


@TORCH
@given(gae_cases())
@example(pattern_case(torch.float32))
@example(pattern_case(torch.float64))
def test_q_lambda_returns_match_the_reference_loop(case):
    expected = slow_q_lambda(
        *(case[k] for k in ("reward", "value", "terminated", "truncated", "final_value")), case["gamma"], case["lam"]
    )
    assert_close(run_q_lambda(case), expected, case)


def test_lambda_zero_is_one_step_q_learning_and_one_is_the_discounted_return():
    reward = torch.tensor([[1.0, 2.0, 3.0]])
    q_max = torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    no = torch.zeros(1, 3, dtype=torch.bool)
    one_step = q_lambda_returns(reward, q_max, no, no, torch.zeros(1, 3), gamma=0.5, q_lambda=0.0)
    torch.testing.assert_close(one_step, torch.tensor([[1 + 0.5 * 20, 2 + 0.5 * 30, 3 + 0.5 * 40]]))
    monte_carlo = q_lambda_returns(reward, q_max, no, no, torch.zeros(1, 3), gamma=0.5, q_lambda=1.0)
    torch.testing.assert_close(
        monte_carlo, torch.tensor([[1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 40, 2 + 1.5 + 10, 3 + 20.0]])
    )


@TORCH
@given(gae_cases(masked=True))
@example(pattern_case(torch.float32, masked=True))
def test_q_lambda_folds_non_decision_steps_as_the_folded_gae_reference_does(case):
    """Another agent's turn or padding is no time step of a row: the return is the folded GAE
    reference loop's advantage over the greedy values (0 at non-decision steps) plus those values."""
    args = [case[k] for k in ("reward", "value", "terminated", "truncated", "final_value")]
    expected = slow_folded_gae(*args, case["valid"], case["gamma"], case["lam"]) + case["value"][:, :-1]
    assert_close(run_q_lambda(case, case["valid"]), expected, case)


def test_the_policy_stores_the_greedy_value_over_the_legal_actions():
    q = torch.tensor([[5.0, 1.0, 0.0], [0.0, 9.0, 1.0]])
    policy = QPolicy(torch.nn.Identity(), 3)
    policy.q_values = lambda obs, model=None: q  # type: ignore[method-assign]
    out = TensorDict({"value": torch.zeros(2)}, [2])
    mask = torch.tensor([[False, True, True], [True, True, True]])
    action, extras, _ = policy.act(
        torch.zeros(2, 1), TensorDict({}, [2]), torch.zeros(2, dtype=torch.bool), mask, out=out
    )
    assert extras is out and out["value"].tolist() == [1.0, 9.0] and action.tolist() == [1, 1]
    assert policy.value(torch.zeros(2, 1)).tolist() == [5.0, 9.0]  # a truncation's last mask is not kept


def test_a_step_minimizes_half_the_squared_error_to_the_return():
    algo = shoal.PQN(**SMALL, seed=1, learning_rate=1e-2)
    pqn = algo.algorithm
    assert isinstance(pqn, PQNAlgorithm)
    learner = pqn.learners["default_policy"]
    obs = torch.randn(8, 4)
    batch = TensorDict(
        {"obs": obs, "action": torch.randint(2, (8,)), "return": torch.randn(8), "value": torch.zeros(8)}, [8]
    )
    policy = learner.policy
    q = policy.q_values(obs).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    expected = 0.5 * (q - batch["return"]).square().mean()
    expected.backward()
    grads = {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}
    assert grads and all("value_head" not in name for name in grads)  # the unused value head learns nothing
    policy.zero_grad(set_to_none=True)
    stats = Statistics(pqn.STAT_NAMES, torch.device("cpu"))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    learner.optimizer.lr = 0.0  # a step at lr 0 leaves the weights: the gradients are what is compared
    pqn.step(learner, Minibatch(batch, None), stats)
    torch.testing.assert_close(stats.mean("loss"), expected.detach())
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p.detach(), before[name])
        if name in grads:
            torch.testing.assert_close(p.grad, grads[name])


def layer_kinds(algo: Any) -> list[str]:
    """The policy's layers in forward order, by kind (containers left out)."""
    names = {torch.nn.Linear: "linear", torch.nn.LayerNorm: "norm", torch.nn.ReLU: "relu", torch.nn.Conv2d: "conv"}
    return [names[type(m)] for m in algo.get_policy().modules() if type(m) in names]


def test_the_q_network_has_layer_norm_before_each_activation_unless_told_otherwise():
    """Linear, LayerNorm, ReLU in each hidden layer; in the CNN a LayerNorm over each pixel's
    channels between each conv and its ReLU too; then the heads (outputs, unused value)."""
    assert layer_kinds(shoal.PQN(**SMALL)) == ["linear", "norm", "relu"] * 2 + ["linear"] * 2
    assert (
        layer_kinds(shoal.PQN(**SMALL, model_config={"layer_norm": False})) == ["linear", "relu"] * 2 + ["linear"] * 2
    )
    assert layer_kinds(shoal.PPO(**SMALL, model_config={"layer_norm": True})).count("norm") == 4  # actor and critic
    minatar = shoal.PQN(env="MinAtar/Breakout-v1", model="cnn", model_config={"hiddens": [128]}, num_envs=2, **QUIET)
    assert layer_kinds(minatar) == ["conv", "norm", "relu", "linear", "norm", "relu", "linear", "linear"]
    (conv_norm,) = [m for m in minatar.get_policy().modules() if isinstance(m, ChannelNorm)]
    x = torch.randn(3, 16, 8, 8) * 5 + 2
    per_pixel = torch.nn.functional.layer_norm(x.movedim(1, -1), (16,), conv_norm.norm.weight, conv_norm.norm.bias)
    torch.testing.assert_close(conv_norm(x), per_pixel.movedim(-1, 1))


def test_epsilon_follows_the_schedule_and_is_logged():
    algo = shoal.PQN(**SMALL, exploration_fraction=0.5, exploration_final_eps=0.1)
    result = algo.train()
    assert result["epsilon"] == 1.0
    assert {"loss", "q_mean", "explained_variance"} <= set(result)
    algo.learn(1024)
    assert algo.get_policy().epsilon == pytest.approx(0.1)


def test_masked_actions_and_several_policies_through_the_flat_batch():
    algo = shoal.PQN(
        **{**SMALL, "env": "pettingzoo:pettingzoo.classic.connect_four_v3"},
        policies=["player_0", "player_1"],
        exploration_initial_eps=0.5,
    )
    result = algo.train()
    assert {"player_0/loss", "player_1/loss"} <= set(result["learner"])
    rollout = algo.algorithm.buffer.rollout
    steps = rollout[:, :-1][rollout["valid"][:, :-1]]
    assert bool(steps["action_mask"].gather(1, steps["action"].unsqueeze(1)).all())  # every action taken was legal


@pytest.mark.parametrize("algo", ["pqn", "dqn"])
def test_a_frozen_policy_acts_greedily_while_the_trained_one_explores(algo):
    """A policy left out of ``policies_to_train`` (a fixed opponent) acts as it has learned."""
    small = {**SMALL, "env": "pettingzoo:pettingzoo.classic.connect_four_v3"}
    if algo == "dqn":
        small |= {"learning_starts": 0, "sgd_minibatch_size": 8}
    trainer = {"pqn": shoal.PQN, "dqn": shoal.DQN}[algo](
        **small, policies=["player_0", "player_1"], policies_to_train=["player_0"], exploration_initial_eps=0.5
    )
    trainer.train()
    assert trainer.get_policy("player_0").epsilon > 0.4  # on its schedule from 0.5
    assert trainer.get_policy("player_1").epsilon == 0.0


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="Discrete actions; 'Pendulum-v1' acts in Box"):
        shoal.PQN(env="Pendulum-v1", **QUIET)
    with pytest.raises(ConfigError, match="feedforward Q-networks only; drop model_config 'core'"):
        shoal.PQN(**SMALL, model_config={"core": "lstm"})
    with pytest.raises(ConfigError, match="target_kl=0.01 .* PQN does not record"):
        shoal.PQN(**SMALL, target_kl=0.01)
    with pytest.raises(ConfigError, match=r"target_kl=0.02 \(policy 'a'\) .* PQN does not record"):  # per policy too
        shoal.PQN(**SMALL, policies={"a": {"target_kl": 0.02}})
    with pytest.raises(ConfigError, match="Did you mean 'q_lambda'"):
        PQNConfig.build(q_lamda=0.5)
    with pytest.raises(ConfigError, match="optimizer"):
        PQNConfig.build(optimizer="sgd")


def test_resume_is_bit_identical(tmp_path):
    kw = dict(SMALL, seed=3)
    kw.pop("save_outputs")
    keys = ("loss", "q_mean", "epsilon", "episode_reward_mean")
    assert_resume_is_bit_identical(shoal.PQN, kw, tmp_path, keys, iterations=5, split=3)


@pytest.mark.slow
def test_pqn_learns_cartpole_at_its_tuned_budget():
    """The tuned config (PQN's CartPole settings, step size 2e-3 for 50k steps, numpy-vectorized envs)."""
    algo = shoal.PQN(env="CartPole-v1", seed=1, **QUIET)
    assert algo.config.vectorization_mode == "vector_entry_point"
    assert algo.config.total_timesteps == 50_000
    algo.learn(algo.config.total_timesteps)
    assert algo.evaluate(20)["episode_reward_mean"] >= 475
