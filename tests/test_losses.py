"""PPO loss terms against element-by-element reference computations."""

import math

import numpy as np
import pytest
import torch

from shoal.algos.losses import explained_variance, masked_mean, normalize_advantage, policy_stats, ppo_loss
from shoal.models.distributions import Categorical, DiagGaussian, MultiCategorical


def reference_ppo_loss(logp, value, entropy, old_logp, adv, old_value, returns, mask, clip, vclip, vf_coef, ent_coef):
    """PPO's loss element by element, with Python floats, differentiated by autograd on scalars."""
    rows = [i for i in range(len(logp)) if mask is None or mask[i]]
    total = 0.0
    for i in rows:
        r = (logp[i] - old_logp[i]).exp()
        pg = torch.maximum(-adv[i] * r, -adv[i] * r.clamp(1 - clip, 1 + clip))
        err = (value[i] - returns[i]) ** 2
        if vclip is not None:
            clipped = old_value[i] + (value[i] - old_value[i]).clamp(-vclip, vclip)
            err = torch.maximum(err, (clipped - returns[i]) ** 2)
        total = total + pg + vf_coef * 0.5 * err - ent_coef * entropy[i]
    return total / len(rows)


def loss_case(vclip: float | None, masked: bool, n: int = 64):
    """``(logp, value, entropy)`` and the rest of ``ppo_loss``'s arguments, in float64."""
    g = torch.Generator().manual_seed(1)
    old_logp = torch.randn(n, generator=g, dtype=torch.float64) * 0.5
    # ratios spread well outside [0.8, 1.2] so every clipping branch is taken, with both advantage signs
    logp = old_logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.4
    value, old_value, returns = (torch.randn(n, generator=g, dtype=torch.float64) for _ in range(3))
    entropy = torch.rand(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, generator=g) > 0.3 if masked else None
    return (logp, value, entropy), (old_logp, adv, old_value, returns, mask, 0.2, vclip, 0.7, 0.05)


@pytest.mark.parametrize("vclip", [None, 0.3])
@pytest.mark.parametrize("masked", [False, True])
def test_ppo_loss_and_gradients_match_reference(vclip, masked):
    (logp, value, entropy), args = loss_case(vclip, masked)
    old_logp, mask = args[0], args[4]
    inputs = [x.clone().requires_grad_() for x in (logp, value, entropy)]
    loss, ratio, pg_loss, v_loss = ppo_loss(*inputs, *args)
    loss.backward()
    ref_inputs = [x.clone().requires_grad_() for x in (logp, value, entropy)]
    ref = reference_ppo_loss(*ref_inputs, *args)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-10)
    for got, want in zip(inputs, ref_inputs):
        assert torch.allclose(got.grad, want.grad, atol=1e-10)
    assert torch.allclose(ratio, (logp - old_logp).exp())
    assert loss.item() == pytest.approx(pg_loss.item() + 0.7 * v_loss.item() - 0.05 * masked_mean(entropy, mask).item())


def test_entropy_is_needed_only_with_an_entropy_bonus():
    (logp, value, entropy), args = loss_case(None, False)
    with pytest.raises(ValueError, match=r"ent_coef=0.05 needs the entropy"):
        ppo_loss(logp, value, None, *args)
    without_bonus = (*args[:-1], 0.0)
    assert torch.equal(
        ppo_loss(logp, value, None, *without_bonus)[0], ppo_loss(logp, value, entropy, *without_bonus)[0]
    )


def test_mask_drops_rows_from_every_mean():
    x = torch.tensor([1.0, 2.0, 100.0])
    mask = torch.tensor([True, True, False])
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    adv = normalize_advantage(torch.tensor([1.0, 3.0, 1e6]), mask)
    assert adv[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)
    z = torch.zeros(3)
    _, _, _, v_loss = ppo_loss(z, torch.tensor([1.0, 1.0, 50.0]), z, z, z, z, z, mask, 0.2, None, 1.0, 0.0)
    assert v_loss.item() == pytest.approx(0.5)


def test_value_clipping_takes_the_pessimistic_error():
    z = torch.zeros(1)
    value, ret = torch.tensor([2.0]), torch.tensor([2.0])
    # unclipped error 0; the prediction clipped to 0.2 has error 1.8^2: the larger is kept
    assert ppo_loss(z, value, z, z, z, z, ret, None, 0.2, 0.2, 1.0, 0.0)[3].item() == pytest.approx(0.5 * 1.8**2)
    assert ppo_loss(z, value, z, z, z, z, ret, None, 0.2, None, 1.0, 0.0)[3].item() == 0.0


def test_policy_stats():
    ratio = torch.tensor([1.0, 1.5, 0.7, 1.1])
    kl, clipfrac = policy_stats(ratio, 0.2, None)
    ref = np.mean([(r - 1) - math.log(r) for r in ratio.tolist()])
    assert kl.item() == pytest.approx(ref, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.5)


def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(y, y) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), y) == pytest.approx(0.0)
    assert math.isnan(explained_variance(y, torch.ones(4)))


def test_categorical_matches_torch_distributions():
    logits = torch.randn(32, 5)
    action = torch.randint(0, 5, (32,))
    logp, ent = Categorical(5).log_prob_entropy(logits, action)
    ref = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(logp, ref.log_prob(action), atol=1e-6)
    assert torch.allclose(ent, ref.entropy(), atol=1e-6)
    a, lp = Categorical(5).sample(logits)
    assert torch.allclose(lp, ref.log_prob(a), atol=1e-6)
    det, _ = Categorical(5).sample(logits, deterministic=True)
    assert torch.equal(det, logits.argmax(-1))


def test_multicategorical_is_a_sum_of_parts():
    dist = MultiCategorical((3, 4))
    logits = torch.randn(8, 7)
    action = torch.stack([torch.randint(0, 3, (8,)), torch.randint(0, 4, (8,))], -1)
    logp, ent = dist.log_prob_entropy(logits, action)
    a = torch.distributions.Categorical(logits=logits[:, :3])
    b = torch.distributions.Categorical(logits=logits[:, 3:])
    assert torch.allclose(logp, a.log_prob(action[:, 0]) + b.log_prob(action[:, 1]), atol=1e-6)
    assert torch.allclose(ent, a.entropy() + b.entropy(), atol=1e-6)


def test_diag_gaussian_matches_torch_distributions():
    mean, log_std = torch.randn(16, 3), torch.randn(3) * 0.3
    ref = torch.distributions.Normal(mean, log_std.exp())
    dist = DiagGaussian(3)
    action, logp = dist.sample(mean, log_std)
    assert torch.allclose(logp, ref.log_prob(action).sum(-1), atol=1e-5)
    assert torch.allclose(dist.log_prob_entropy(mean, log_std, action)[0], ref.log_prob(action).sum(-1), atol=1e-5)
    mode, mode_logp = dist.sample(mean, log_std, deterministic=True)
    assert torch.equal(mode, mean) and torch.allclose(mode_logp, ref.log_prob(mean).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(log_std, 16), ref.entropy().sum(-1), atol=1e-5)


def test_categorical_sampling_frequencies_match_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.3])
    logits = probs.log().expand(20_000, 3)
    action, logp = Categorical(3).sample(logits)
    freq = torch.bincount(action, minlength=3).float() / 20_000
    assert torch.allclose(freq, probs, atol=0.015)
    assert torch.allclose(logp, probs.log()[action])
