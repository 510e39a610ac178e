"""The hand-fused PPO learn step equals the autograd path: each written-out backward against
autograd, one minibatch step, and one whole PPO update (same parameters to 1e-6); and it is used
only where it applies."""

import copy

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from test_losses import loss_case, named
from test_masks import allowed_action, random_mask

import shoal
from shoal.algos.losses import ppo_loss
from shoal.algos.optim import AutogradOptimizer
from shoal.algos.ppo_fused import (
    FusedPPOStep,
    _categorical_forward,
    _dist_backward,
    _dist_forward,
    flatten_parameters,
    fused_unavailable,
    ppo_loss_and_grad,
    stacked_backward,
)
from shoal.buffers import RolloutBuffer
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from shoal.models.distributions import Categorical, MultiCategorical
from shoal.models.layers import SMALL_BATCH, StackedMLP, stacked_forward
from shoal.models.normalize import ObsNormalizer
from tests.conftest import build_ppo, mlp_policy

SPACES = [gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 4]), gym.spaces.Box(-1.0, 1.0, (2,))]


@pytest.mark.parametrize("per_tower", [False, True])  # one input for both towers, or one each
@pytest.mark.parametrize("rows", [4, SMALL_BATCH + 1])  # both forms of tanh
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_stacked_backward_equals_autograd(activation, rows, per_tower):
    torch.manual_seed(0)
    net = StackedMLP(5, [7, 6], [3, 1], [0.01, 1.0], activation).double()
    x = torch.randn(*((2,) if per_tower else ()), rows, 5, dtype=torch.float64)
    grad_outs = (torch.randn(rows, 3, dtype=torch.float64), torch.randn(rows, 1, dtype=torch.float64))
    outs = net(x)  # autograd
    torch.autograd.backward(outs, grad_outs)
    params = net.flat_params
    with torch.no_grad():
        fused_outs, hidden = stacked_forward(x, activation, 2, params)
        grads = [torch.full_like(p, float("nan")) for p in params]  # every entry must be written
        stacked_backward(x, activation, params, hidden, grad_outs, grads)
    for got, want in zip(fused_outs, outs):
        assert torch.allclose(got, want, atol=1e-12)
    for got, p in zip(grads, params):
        assert torch.allclose(got, p.grad, atol=1e-12), (got - p.grad).abs().max()


@pytest.mark.parametrize("nvec", [(5,), (3, 4, 2)])
def test_distribution_backward_equals_autograd_with_masks(nvec):
    """With entropy gradients above 1, which overflow (inf * 0 = NaN, in autograd too) when a
    masked log-probability is near finfo.min."""
    g = torch.Generator().manual_seed(2)
    policy = mlp_policy(3, gym.spaces.Discrete(nvec[0]) if len(nvec) == 1 else gym.spaces.MultiDiscrete(nvec))
    rows = 16
    mask = random_mask(nvec, rows, g)
    mask[0] = False  # a padding row
    logits = torch.randn(rows, sum(nvec), generator=g, requires_grad=True)
    action = allowed_action(mask, nvec, g)
    grad_logp, grad_ent = torch.randn(rows, generator=g), 10.0 * torch.randn(rows, generator=g)

    logp, ent = policy.dist.log_prob_entropy(logits, action, mask=mask)
    (grad_logp * logp + grad_ent * ent).sum().backward()
    with torch.no_grad():
        fused_logp, fused_ent, ctx = _dist_forward(policy, logits, action, True, mask)
        got = _dist_backward(policy, ctx, grad_logp, grad_ent)
    assert torch.equal(fused_logp, logp) and torch.equal(fused_ent, ent)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, logits.grad, atol=1e-5), (got - logits.grad).abs().max()
    blocked = ~mask & torch.cat([m.any(-1, keepdim=True).expand_as(m) for m in mask.split(list(nvec), -1)], -1)
    assert got[blocked].eq(0).all() and blocked.any()


def test_gaussian_backward_equals_autograd():
    torch.manual_seed(1)
    policy = mlp_policy(3, gym.spaces.Box(-1.0, 1.0, (2,)), log_std_init=-0.3).double()
    mean = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    action = torch.randn(8, 2, dtype=torch.float64)
    grad_logp, grad_ent = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    logp, ent = policy.dist.log_prob_entropy(mean, policy.log_std, action)
    (grad_logp * logp + grad_ent * ent).sum().backward()
    policy.log_std.grad, want_log_std = torch.zeros(2, dtype=torch.float64), policy.log_std.grad.clone()
    with torch.no_grad():
        _, _, ctx = _dist_forward(policy, mean, action, True, None)
        got = _dist_backward(policy, ctx, grad_logp, grad_ent)
    assert torch.allclose(got, mean.grad, atol=1e-12)
    assert torch.allclose(policy.log_std.grad, want_log_std, atol=1e-12)


@pytest.mark.parametrize("vclip", [None, 0.3])
@pytest.mark.parametrize("masked", [False, True])
def test_loss_gradient_equals_autograd(vclip, masked):
    outputs, batch, mask, coefficients = loss_case(vclip, masked)
    inputs = [x.clone().requires_grad_() for x in outputs]
    want = ppo_loss(batch, mask=mask, **named(inputs), **coefficients)
    want.loss.backward()
    got, grads = ppo_loss_and_grad(batch, mask=mask, **named(outputs), **coefficients)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-12)
    for grad, x in zip(grads, inputs):
        assert torch.allclose(grad, x.grad, atol=1e-12)
    none, grads_only = ppo_loss_and_grad(batch, mask=mask, with_values=False, **named(outputs), **coefficients)
    assert none is None and all(torch.equal(a, b) for a, b in zip(grads_only, grads))


def _minibatch(space, n=32, critic_dim=0, masked=False, seed=3):
    g = torch.Generator().manual_seed(seed)
    mb = {
        "obs": torch.randn(n, 5, generator=g),
        "action": torch.stack([torch.as_tensor(space.sample()) for _ in range(n)]),
    }
    if critic_dim:
        mb["critic_obs"] = torch.randn(n, critic_dim, generator=g)
    mask = None
    if masked:
        nvec = action_spec(space).nvec
        mask = torch.rand(n, generator=g) > 0.2  # padding rows too, whose masks allow nothing
        mb["action_mask"] = random_mask(nvec, n, g)
        mb["action_mask"][~mask] = False
        mb["action_mask"][int(mask.nonzero()[0])] = False  # and a valid row with nothing allowed
        mb["action"] = allowed_action(mb["action_mask"], nvec, g)
    for key in ("sample_log_prob", "advantage", "value", "return"):
        mb[key] = torch.randn(n, generator=g)
    return TensorDict(mb, batch_size=[n]), mask


CASES = [
    (space, case)
    for space in SPACES
    for case in ("plain", "masked", "critic", "normalized")
    if not (case == "masked" and isinstance(space, gym.spaces.Box))
]  # masks are for discrete actions


@pytest.mark.parametrize("space,case", CASES, ids=[f"{type(s).__name__}-{c}" for s, c in CASES])
def test_one_minibatch_step_equals_autograd(space, case):
    """Every loss term on (entropy bonus, value clipping), with masks and padding rows, a
    centralized critic, or observation normalization; weights far from the small-gain init, so
    every gradient path is exercised."""
    torch.manual_seed(0)
    critic_dim = 9 if case == "critic" else 0
    policy = mlp_policy(5, space, log_std_init=-0.3, critic_dim=critic_dim)
    if case == "normalized":
        policy.obs_normalizer = ObsNormalizer((5,), 10.0)
        policy.obs_normalizer.stats.update(torch.randn(50, 5) * 3 + 1)
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_()
    twin = copy.deepcopy(policy)
    mb, mask = _minibatch(space, critic_dim=critic_dim, masked=case == "masked")
    coefficients = dict(clip_coef=0.2, vf_clip_coef=0.3, vf_coef=0.7, ent_coef=0.05)
    fused, plain = FusedPPOStep(policy, 1e-3, 1e-5, 0.5), AutogradOptimizer(twin, 1e-3, 1e-5, 0.5)
    fused.flat.grad.fill_(float("nan"))  # the fused path must overwrite every entry
    got, got_ent = fused(mb, mask=mask, track=True, need_entropy=True, **coefficients)
    logp, want_ent, value = twin.evaluate(
        mb["obs"], mb["action"], True, mb.get("action_mask", None), mb.get("critic_obs", None)
    )
    want = ppo_loss(mb, log_prob=logp, value=value, entropy=want_ent, mask=mask, **coefficients)
    plain.backward(want.loss)
    plain.step()
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))
    assert torch.allclose(got_ent, want_ent)
    for p, q in zip(policy.parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), (p.grad - q.grad).abs().max()
        assert torch.allclose(p, q, atol=1e-6)


def _random_rollout(env: EnvInfo, horizon: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    fields = dict.fromkeys(("sample_log_prob", "value", "final_value", "advantage", "return"), ((), torch.float32))
    rollout = RolloutBuffer(env, horizon, fields).start_rollout()
    for key in ("obs", "reward", "value", "sample_log_prob"):
        rollout[key].copy_(torch.randn(rollout[key].shape, generator=g))
    rollout["action"].copy_(torch.randint(0, 3, rollout["action"].shape, generator=g))
    rollout["terminated"].copy_(torch.rand(rollout["terminated"].shape, generator=g) < 0.1)
    rollout["done"].copy_(rollout["terminated"])
    return rollout


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_whole_ppo_update_gives_the_same_parameters_both_ways(dtype):
    """PPO's update (GAE, 4 epochs of 4 shuffled minibatches, clipping, Adam) with the fused
    step and with autograd, from the same weights: the parameters agree to 1e-6."""
    space = gym.spaces.Discrete(3)
    env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (5,))), action_spec(space), 8, 1)
    settings = dict(num_envs=8, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=4, ent_coef=0.01)
    settings |= dict(vf_clip_coef=0.2, learning_rate=3e-3, model_config={"hiddens": [64, 64]})
    algos = [build_ppo(PPOConfig(**settings, fused_update=fused), env, dtype) for fused in (True, False)]
    learners = [algo.learners["default_policy"] for algo in algos]
    assert isinstance(learners[0].optimizer, FusedPPOStep) and isinstance(learners[1].optimizer, AutogradOptimizer)
    start = [p.detach().clone() for p in learners[0].policy.parameters()]
    stats = [algo.learn(learner, _random_rollout(env, 16, seed=4), None) for algo, learner in zip(algos, learners)]
    assert stats[0]["num_sgd_steps"] == stats[1]["num_sgd_steps"] == 16
    moved = max((p - q).abs().max().item() for p, q in zip(learners[0].policy.parameters(), start))
    assert moved > 1e-3  # the update really changed the weights
    for p, q in zip(learners[0].policy.parameters(), learners[1].policy.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (p - q).abs().max()
    assert stats[0]["policy_loss"] == pytest.approx(stats[1]["policy_loss"], rel=1e-4, abs=1e-6)


def test_fused_adam_matches_torch_adam_with_clipping():
    torch.manual_seed(0)
    policy = mlp_policy(4, gym.spaces.Discrete(2))
    twin = copy.deepcopy(policy)
    fused = FusedPPOStep(policy, 1e-2, 1e-5, 0.5)
    ref = torch.optim.Adam(twin.parameters(), lr=1e-2, eps=1e-5)
    for _ in range(10):
        grads = [torch.randn_like(p) * 5 for p in policy.parameters()]
        for p, grad in zip(policy.parameters(), grads):
            p.grad.copy_(grad)
        fused._adam(loss=lambda: 0.0)
        ref.zero_grad()
        for p, grad in zip(twin.parameters(), grads):
            p.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
        ref.step()
    for p, q in zip(policy.parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()


class OwnModel(torch.nn.Module):
    def __init__(self, obs_space, action_space, num_outputs, hidden=32):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh())
        self.pi, self.v = torch.nn.Linear(hidden, num_outputs), torch.nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def test_the_fused_step_serves_only_the_plain_built_in_mlp():
    policy = mlp_policy(4, gym.spaces.Discrete(2))
    assert fused_unavailable(policy, True) is None
    assert fused_unavailable(policy, False) == "fused_update is off"
    handle = policy.model.register_forward_hook(lambda *args: None)
    assert "hooks" in fused_unavailable(policy, True)
    handle.remove()
    next(policy.parameters()).register_hook(lambda grad: grad * 2)
    assert "hooks" in fused_unavailable(policy, True)
    kw = dict(
        env="CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, save_outputs=False, verbose=0
    )
    with shoal.PPO(model=OwnModel, **kw) as algo:
        learner = algo.algorithm.learners["default_policy"]
        assert "not the built-in MLP" in fused_unavailable(learner.policy, True)
        assert isinstance(learner.optimizer, AutogradOptimizer)
    for other in (
        {"model_config": {"shared_trunk": True}},
        {"accumulate_minibatches": 2, "sgd_minibatch_size": 8},
        {"prio_alpha": 0.5},
    ):
        with shoal.PPO(**kw | other) as algo:
            assert isinstance(algo.algorithm.learners["default_policy"].optimizer, AutogradOptimizer), other
    with shoal.PPO(**kw) as algo:
        assert isinstance(algo.algorithm.learners["default_policy"].optimizer, FusedPPOStep)
        algo.get_policy().model.register_forward_hook(lambda *args: None)  # too late: never silently skipped
        with pytest.raises(shoal.ConfigError, match=r"MLPModel has hooks.*fused_update=false"):
            algo.train()


def test_categorical_context_holds_the_masked_log_probabilities():
    dist = Categorical(3)
    logits, mask = torch.zeros(2, 3), torch.tensor([[True, False, True], [True, True, True]])
    _, ent, (logp_all, _, ent_again) = _categorical_forward(dist, logits, torch.tensor([0, 1]), True, mask)
    assert logp_all[0, 1] < -1e18 and torch.equal(ent, ent_again)
    assert isinstance(MultiCategorical((2, 2)).split(torch.zeros(1, 4), None)[0][0], Categorical)


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
