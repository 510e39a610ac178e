"""Network pieces: fast tanh, stacked towers, flat parameters, normalizers."""

import numpy as np
import torch

from shoal.models.flat import flatten_parameters
from shoal.models.layers import StackedMLP, fast_tanh
from shoal.models.normalize import RewardScaler, RunningMeanStd


def test_fast_tanh_value_and_gradient():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(fast_tanh(x), torch.tanh(x), atol=1e-12)
    assert torch.autograd.gradcheck(fast_tanh, (x[::50].detach().clone().requires_grad_(),))


def test_stacked_mlp_equals_separate_mlps():
    torch.manual_seed(0)
    net = StackedMLP(2, 5, [7, 6])
    x = torch.randn(4, 5)
    out = net(x)
    for k in range(2):
        h = x
        for w, b in zip(net.weights, net.biases):
            h = torch.tanh(h @ w[k] + b[k, 0])
        assert torch.allclose(out[k], h, atol=1e-6)
    # orthogonal init per tower: columns of each [in, out] block are orthogonal with gain sqrt(2)
    w = net.weights[1][0]
    assert torch.allclose(w.T @ w, 2 * torch.eye(6), atol=1e-5)


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
