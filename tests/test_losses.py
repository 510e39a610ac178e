"""PPO loss terms against element-by-element reference computations."""

import math

import numpy as np
import pytest
import torch

from shoal.algos.losses import (
    clipped_surrogate, explained_variance, masked_mean, normalize_advantage, policy_stats, value_loss,
)
from shoal.models.distributions import Categorical, DiagGaussian, MultiCategorical


def test_clipped_surrogate_matches_loop():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(50, generator=g) * 0.3, torch.randn(50, generator=g) * 0.3
    adv = torch.randn(50, generator=g)
    loss, ratio = clipped_surrogate(logp, old, adv, 0.2, None)
    ref = []
    for lp, o, a in zip(logp.tolist(), old.tolist(), adv.tolist()):
        r = math.exp(lp - o)
        ref.append(-min(r * a, min(max(r, 0.8), 1.2) * a))
    assert loss.item() == pytest.approx(np.mean(ref), abs=1e-6)
    assert torch.allclose(ratio, (logp - old).exp())


def test_mask_drops_rows_from_every_mean():
    x = torch.tensor([1.0, 2.0, 100.0])
    mask = torch.tensor([True, True, False])
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    adv = normalize_advantage(torch.tensor([1.0, 3.0, 1e6]), mask)
    assert adv[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)
    v = value_loss(torch.tensor([1.0, 1.0, 50.0]), torch.zeros(3), torch.zeros(3), None, mask)
    assert v.item() == pytest.approx(0.5)


def test_value_clipping_takes_the_pessimistic_error():
    value, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([2.0])
    # unclipped error 0; clipped prediction 0.2 has error 1.8^2: the max is kept
    assert value_loss(value, old, ret, 0.2, None).item() == pytest.approx(0.5 * 1.8**2)
    assert value_loss(value, old, ret, None, None).item() == 0.0


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
    assert torch.allclose(dist.log_prob(mean, log_std, action), ref.log_prob(action).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy(log_std, 16), ref.entropy().sum(-1), atol=1e-5)


def test_categorical_sampling_frequencies_match_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.3])
    logits = probs.log().expand(20_000, 3)
    action, logp = Categorical(3).sample(logits)
    freq = torch.bincount(action, minlength=3).float() / 20_000
    assert torch.allclose(freq, probs, atol=0.015)
    assert torch.allclose(logp, probs.log()[action])
