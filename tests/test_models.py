"""Network pieces: stacked towers and the engine-free learn step (hand-written backwards), flat
parameters, normalizers."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algos.losses import ppo_loss, ppo_loss_and_grad
from shoal.envs.spaces import action_spec
from shoal.models.flat import flatten_parameters
from shoal.models.policy import ActorCritic
from shoal.models.layers import SMALL_BATCH, StackedMLP, _StackedMLPFunction
from shoal.models.normalize import RewardScaler, RunningMeanStd


@pytest.mark.parametrize("per_tower", [False, True])  # one input for both towers, or one each
@pytest.mark.parametrize("rows", [4, SMALL_BATCH + 1])  # both forms of tanh
@pytest.mark.parametrize("activation,ref", [("tanh", torch.tanh), ("relu", torch.relu)])
def test_stacked_mlp_equals_separate_mlps(activation, ref, rows, per_tower):
    torch.manual_seed(0)
    net = StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0], activation).double()
    x = torch.randn(*((2,) if per_tower else ()), rows, 5, dtype=torch.float64)
    outs = net(x)
    for k in range(2):
        h = x[k] if per_tower else x
        for w, b in zip(net.weights, net.biases):
            h = ref(h @ w[k] + b[k, 0])
        assert torch.allclose(outs[k], net.heads[k](h), atol=1e-12)
    # the hand-written backward against finite differences, including the input's gradient
    params = [p.detach().clone().requires_grad_() for p in net._params]
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, *p: _StackedMLPFunction.apply(x, activation, 2, *p), (xg, *params))


def test_stacked_mlp_init_is_orthogonal_per_tower():
    net = StackedMLP(5, [7, 6], [2, 1], [0.01, 1.0])
    w = net.weights[1][0]
    assert torch.allclose(w.T @ w, 2 * torch.eye(6), atol=1e-5)
    head = net.heads[0].weight
    assert torch.allclose(head @ head.T, 1e-4 * torch.eye(2), atol=1e-7)


def test_flat_parameters_share_storage_and_receive_grads():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = [p.detach().clone() for p in net.parameters()]
    flat = flatten_parameters(net)
    assert flat.numel() == sum(p.numel() for p in net.parameters())
    for p, b in zip(net.parameters(), before):
        assert torch.equal(p, b)
    net(torch.randn(5, 3)).sum().backward()
    assert flat.grad.abs().sum() > 0
    with torch.no_grad():
        flat.add_(1.0)
    assert torch.equal(next(net.parameters()), before[0] + 1.0)


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


def test_flat_adam_matches_torch_adam_with_clipping():
    from shoal.models.flat import FlatAdam

    torch.manual_seed(0)
    a = torch.nn.Linear(6, 3)
    b = torch.nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    flat = flatten_parameters(b)
    opt = FlatAdam(flat, lr=1e-2, eps=1e-5)
    for _ in range(10):
        x = torch.randn(16, 6) * 5
        ref.zero_grad()
        a(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5)
        ref.step()
        opt.zero_grad()
        b(x).square().sum().backward()
        opt.clip_grad_norm_(0.5)
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), (pa - pb).abs().max()


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 4]),
                                   gym.spaces.Box(-1.0, 1.0, (2,))])
def test_engine_free_gradient_equals_autograd(space):
    """ActorCritic.evaluate_backward + ppo_loss_and_grad against autograd through evaluate + ppo_loss,
    with every loss term on: entropy bonus, value clipping, masked rows."""
    torch.manual_seed(0)
    policy = ActorCritic(5, action_spec(space), [7, 6], log_std_init=-0.3)  # float32: the model casts obs
    flat = flatten_parameters(policy)
    with torch.no_grad():
        flat.normal_()  # weights far from the small-gain init, so every gradient path is exercised
    n = 32
    obs = torch.randn(n, 5)
    action = torch.stack([torch.as_tensor(space.sample()) for _ in range(n)])
    old_logp, adv, old_value, returns = (torch.randn(n) for _ in range(4))
    mask = torch.rand(n) > 0.2
    args = (old_logp, adv, old_value, returns, mask, 0.2, 0.3, 0.7, 0.05)

    want, _ = assert_engine_free_backward_matches_autograd(policy, flat, obs, action, args)

    flat.grad.fill_(float("nan"))  # the gradient alone, without the loss values
    outputs, _ = policy.evaluate_backward(
        obs, action, lambda logp, ent, value: ppo_loss_and_grad(logp, value, ent, *args, with_values=False))
    assert outputs is None
    assert torch.allclose(flat.grad, want, rtol=1e-4, atol=1e-6)


def assert_engine_free_backward_matches_autograd(policy, flat, obs, action, args, action_mask=None, critic_obs=None):
    """``evaluate_backward`` + ``ppo_loss_and_grad`` give autograd's loss, entropy and gradient
    through ``evaluate`` + ``ppo_loss``; returns autograd's gradient and entropy."""
    logp, ent, value = policy.evaluate(obs, action, action_mask=action_mask, critic_obs=critic_obs)
    loss = ppo_loss(logp, value, ent, *args)[0]
    flat.grad.zero_()
    loss.backward()
    want = flat.grad.clone()

    flat.grad.fill_(float("nan"))  # the engine-free path must overwrite every entry
    (got_loss, *_), got_ent = policy.evaluate_backward(
        obs, action, lambda logp, ent, value: ppo_loss_and_grad(logp, value, ent, *args), action_mask=action_mask,
        critic_obs=critic_obs)
    assert got_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert torch.allclose(got_ent, ent)
    assert torch.allclose(flat.grad, want, rtol=1e-4, atol=1e-6), (flat.grad - want).abs().max()
    return want, ent


@pytest.mark.parametrize("critic_dim", [3, 9])  # narrower and wider than the actor's obs
def test_a_centralized_critic_sees_only_its_input_and_its_gradient_matches_autograd(critic_dim):
    torch.manual_seed(0)
    policy = ActorCritic(5, action_spec(gym.spaces.Discrete(3)), [7, 6], critic_dim=critic_dim)
    flat = flatten_parameters(policy)
    with torch.no_grad():
        flat.normal_()
    n = 32
    obs, critic_obs = torch.randn(n, 5), torch.randn(n, critic_dim)
    params, value = policy(obs, critic_obs)
    other_params, other_value = policy(torch.randn(n, 5), critic_obs)  # the actor's obs moves only the actor
    assert torch.equal(value, other_value) and not torch.equal(params, other_params)
    assert not torch.equal(value, policy.value(obs, torch.randn(n, critic_dim)))
    action = torch.randint(0, 3, (n,))
    args = (torch.randn(n), torch.randn(n), torch.randn(n), torch.randn(n), None, 0.2, None, 0.7, 0.05)
    assert_engine_free_backward_matches_autograd(policy, flat, obs, action, args, critic_obs=critic_obs)
