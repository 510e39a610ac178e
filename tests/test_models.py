"""Network pieces: stacked towers, normalizers, the centralized critic's inputs. (The hand-fused
learn step's backward passes: tests/test_fused.py.)"""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algos.optim import TargetNetwork
from shoal.models.actors import QTowers
from shoal.models.layers import SMALL_BATCH, StackedMLP
from shoal.models.normalize import RewardScaler, RunningMeanStd
from tests.conftest import mlp_policy


@pytest.mark.parametrize("per_tower", [False, True])  # one input for both towers, or one each
@pytest.mark.parametrize("rows", [4, SMALL_BATCH + 1])  # both forms of tanh
@pytest.mark.parametrize("activation,ref", [("tanh", torch.tanh), ("relu", torch.relu)])
def test_stacked_mlp_equals_separate_mlps(activation, ref, rows, per_tower):
    torch.manual_seed(0)
    net = StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0], activation).double()
    x = torch.randn(*((2,) if per_tower else ()), rows, 5, dtype=torch.float64)
    with torch.no_grad():
        rollout_outs = net(x)  # the fast activations, no graph
    outs = net(x)  # autograd
    for k in range(2):
        h = x[k] if per_tower else x
        for w, b in zip(net.weights, net.biases):
            h = ref(h @ w[k] + b[k, 0])
        assert torch.allclose(outs[k], net.heads[k](h), atol=1e-12)
        assert torch.allclose(rollout_outs[k], outs[k], atol=1e-12)


@pytest.mark.parametrize("assign", [False, True])
def test_stacked_mlp_rollout_path_reads_the_weights_loaded_into_it(assign):
    """``load_state_dict(assign=True)`` puts new parameters in; the no-graph path lists its
    parameters once, and must list them again."""
    net, other = StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0]), StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0])
    net.load_state_dict(other.state_dict(), assign=assign)
    x = torch.randn(4, 5)
    with torch.no_grad():
        for fast, loaded in zip(net(x), other(x)):
            torch.testing.assert_close(fast, loaded)
    assert {id(p) for p in net.flat_params} == {id(p) for p in net.parameters()}
    copied = copy.deepcopy(net)  # a target network: the hook comes along
    copied.load_state_dict(StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0]).state_dict(), assign=True)
    assert {id(p) for p in copied.flat_params} == {id(p) for p in copied.parameters()}


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_one_tower_alone_is_that_towers_output_and_gradient(activation):
    """``tower(x, k)`` (TD3's actor loss reads Q_1 alone) against ``forward(x)[k]``: the values, and
    the gradients they send to the input and to the tower's parameters."""
    torch.manual_seed(0)
    net = StackedMLP(5, [7, 6], [1, 1], [1.0, 1.0], activation).double()
    for k in range(2):
        grads = []
        for one in (lambda x: net.tower(x, k), lambda x: net(x)[k]):  # noqa: B023 (k is used at once)
            x = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(k)).requires_grad_()
            net.zero_grad()
            out = one(x)
            out.sum().backward()
            grads.append((out.detach(), x.grad, *(p.grad.clone() for p in net.parameters() if p.grad is not None)))
        for alone, whole in zip(*grads):
            torch.testing.assert_close(alone, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_stacked_heads_equal_the_heads_tower_by_tower(activation):
    """``stacked(x)`` (twin critics' heads as one batched matmul) against ``forward(x)`` (each head on
    its tower): the values with and without autograd, and the gradients to the input and parameters."""
    torch.manual_seed(0)
    net = StackedMLP(5, [7, 6], [3, 3], [1.0, 1.0], activation).double()
    with torch.no_grad():  # biases that differ by tower and output, so a mixed-up layout shows
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    grads = []
    for outputs in (net.stacked, lambda x: torch.stack(net(x))):
        x = torch.randn(9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        net.zero_grad()
        out = outputs(x)
        (out * torch.arange(1.0, 7.0, dtype=torch.float64).view(2, 1, 3)).sum().backward()  # outputs weighted apart
        with torch.no_grad():
            torch.testing.assert_close(outputs(x), out.detach(), rtol=1e-12, atol=1e-12)
        grads.append((out.detach(), x.grad, *(p.grad.clone() for p in net.parameters())))
    for stacked, by_tower in zip(*grads, strict=True):
        torch.testing.assert_close(stacked, by_tower, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("towers,rows,per_tower", [(1, 1, False), (2, 1, False), (2, 5, False), (2, 5, True)])
def test_q_towers_give_each_towers_value(towers, rows, per_tower):
    torch.manual_seed(0)
    q = QTowers(4, [8, 8], towers).double()
    x = torch.randn(*((towers,) if per_tower else ()), rows, 4, dtype=torch.float64)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            values = q(x)
            assert values.shape == (towers, rows)
            for k in range(towers):
                torch.testing.assert_close(values[k], q.net.forward_hidden(x)[0][k].squeeze(-1), rtol=1e-12, atol=1e-12)


def test_a_target_network_moves_its_floats_by_tau_and_copies_the_rest():
    online = torch.nn.BatchNorm1d(3)
    target = TargetNetwork(online)
    with torch.no_grad():
        online.weight.fill_(2.0)
        online.running_mean.fill_(4.0)
    online.num_batches_tracked.fill_(7)
    target.update(0.25)
    assert torch.equal(target.module.weight, torch.full((3,), 1.25))  # 1 + 0.25 * (2 - 1)
    assert torch.equal(target.module.running_mean, torch.full((3,), 1.0))
    assert int(target.module.num_batches_tracked) == 7
    assert not target.module.weight.requires_grad
    target.update(1.0)
    assert torch.equal(target.module.weight, online.weight.detach())


def test_stacked_mlp_init_is_orthogonal_per_tower():
    net = StackedMLP(5, [7, 6], [2, 1], [0.01, 1.0])
    w = net.weights[1][0]
    assert torch.allclose(w.T @ w, 2 * torch.eye(6), atol=1e-5)
    head = net.heads[0].weight
    assert torch.allclose(head @ head.T, 1e-4 * torch.eye(2), atol=1e-7)


def test_running_mean_std_matches_numpy():
    rms = RunningMeanStd((3,), eps=0.0)
    rng = np.random.default_rng(1)
    chunks = [rng.normal(2.0, 3.0, size=(n, 3)) for n in (5, 17, 1, 40)]
    rms.count.fill_(0)
    for c in chunks:
        if rms.count.item() == 0:
            rms.mean.copy_(torch.tensor(c.mean(0)))
            rms.var.copy_(torch.tensor(c.var(0)))
            rms.count.fill_(len(c))
        else:
            rms.update(torch.tensor(c))
    allx = np.concatenate(chunks)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-10)


def test_reward_scaler_resets_return_on_done():
    scaler = RewardScaler(2, gamma=0.5, clip=10.0)
    out = torch.zeros(2)
    scaler.scale(torch.tensor([1.0, 1.0]), torch.tensor([True, False]), out)
    assert scaler.ret.tolist() == [0.0, 1.0]
    scaler.scale(torch.tensor([1.0, 1.0]), torch.tensor([False, False]), out)
    assert scaler.ret.tolist() == [1.0, 1.5]


@pytest.mark.parametrize("critic_dim", [3, 9])  # narrower and wider than the actor's obs
def test_a_centralized_critic_sees_only_its_input(critic_dim):
    torch.manual_seed(0)
    policy = mlp_policy(5, gym.spaces.Discrete(3), critic_dim=critic_dim)
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_()
    n = 32
    obs, critic_obs = torch.randn(n, 5), torch.randn(n, critic_dim)
    params, value = policy(obs, critic_obs)
    other_params, other_value = policy(torch.randn(n, 5), critic_obs)  # the actor's obs moves only the actor
    assert torch.equal(value, other_value) and not torch.equal(params, other_params)
    assert not torch.equal(value, policy.value(obs, torch.randn(n, critic_dim)))
