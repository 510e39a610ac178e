"""PPO loss terms against element-by-element reference computations."""

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from shoal.algos.losses import explained_variance, masked_mean, normalize_advantage, policy_stats, ppo_loss
from shoal.models.distributions import Categorical, DiagGaussian, MultiCategorical


def reference_ppo_loss(logp, value, entropy, batch, mask, clip_coef, vf_clip_coef, vf_coef, ent_coef):
    """PPO's loss element by element, with Python floats, differentiated by autograd on scalars."""
    old_logp, adv, old_value, returns = (batch[k] for k in ("sample_log_prob", "advantage", "value", "return"))
    rows = [i for i in range(len(logp)) if mask is None or mask[i]]
    total = 0.0
    for i in rows:
        r = (logp[i] - old_logp[i]).exp()
        pg = torch.maximum(-adv[i] * r, -adv[i] * r.clamp(1 - clip_coef, 1 + clip_coef))
        err = (value[i] - returns[i]) ** 2
        if vf_clip_coef is not None:
            clipped = old_value[i] + (value[i] - old_value[i]).clamp(-vf_clip_coef, vf_clip_coef)
            err = torch.maximum(err, (clipped - returns[i]) ** 2)
        total = total + pg + vf_coef * 0.5 * err - ent_coef * entropy[i]
    return total / len(rows)


def minibatch(old_logp, adv, old_value, returns) -> TensorDict:
    """What ``ppo_loss`` reads of a minibatch."""
    fields = {"sample_log_prob": old_logp, "advantage": adv, "value": old_value, "return": returns}
    return TensorDict(fields, batch_size=old_logp.shape)


def loss_case(vclip: float | None, masked: bool, n: int = 64):
    """The current policy's ``(logp, value, entropy)``, the minibatch, the mask and the
    coefficients, in float64."""
    g = torch.Generator().manual_seed(1)
    old_logp = torch.randn(n, generator=g, dtype=torch.float64) * 0.5
    # ratios spread well outside [0.8, 1.2] so every clipping branch is taken, with both advantage signs
    logp = old_logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.4
    value, old_value, returns = (torch.randn(n, generator=g, dtype=torch.float64) for _ in range(3))
    entropy = torch.rand(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, generator=g) > 0.3 if masked else None
    coefficients = dict(clip_coef=0.2, vf_clip_coef=vclip, vf_coef=0.7, ent_coef=0.05)
    return (logp, value, entropy), minibatch(old_logp, adv, old_value, returns), mask, coefficients


def named(outputs) -> dict:
    logp, value, entropy = outputs
    return dict(log_prob=logp, value=value, entropy=entropy)


@pytest.mark.parametrize("vclip", [None, 0.3])
@pytest.mark.parametrize("masked", [False, True])
def test_ppo_loss_and_gradients_match_reference(vclip, masked):
    outputs, batch, mask, coefficients = loss_case(vclip, masked)
    inputs = [x.clone().requires_grad_() for x in outputs]
    terms = ppo_loss(batch, mask=mask, **named(inputs), **coefficients)
    terms.loss.backward()
    ref_inputs = [x.clone().requires_grad_() for x in outputs]
    ref = reference_ppo_loss(*ref_inputs, batch, mask, **coefficients)
    ref.backward()
    assert terms.loss.item() == pytest.approx(ref.item(), abs=1e-10)
    for got, want in zip(inputs, ref_inputs):
        assert torch.allclose(got.grad, want.grad, atol=1e-10)
    assert torch.allclose(terms.ratio, (outputs[0] - batch["sample_log_prob"]).exp())
    entropy = masked_mean(outputs[2], mask).item()
    assert terms.loss.item() == pytest.approx(terms.policy_loss.item() + 0.7 * terms.vf_loss.item() - 0.05 * entropy)


def test_entropy_is_needed_only_with_an_entropy_bonus():
    (logp, value, entropy), batch, _, coefficients = loss_case(None, False)
    with pytest.raises(ValueError, match=r"ent_coef=0.05 needs the entropy"):
        ppo_loss(batch, log_prob=logp, value=value, entropy=None, mask=None, **coefficients)
    without_bonus = coefficients | {"ent_coef": 0.0}
    assert torch.equal(
        ppo_loss(batch, log_prob=logp, value=value, entropy=None, mask=None, **without_bonus).loss,
        ppo_loss(batch, log_prob=logp, value=value, entropy=entropy, mask=None, **without_bonus).loss,
    )


PLAIN = dict(clip_coef=0.2, vf_clip_coef=None, vf_coef=1.0, ent_coef=0.0)


def test_mask_drops_rows_from_every_mean():
    x = torch.tensor([1.0, 2.0, 100.0])
    mask = torch.tensor([True, True, False])
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    adv = normalize_advantage(torch.tensor([1.0, 3.0, 1e6]), mask)
    assert adv[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)
    z = torch.zeros(3)
    terms = ppo_loss(
        minibatch(z, z, z, z), log_prob=z, value=torch.tensor([1.0, 1.0, 50.0]), entropy=z, mask=mask, **PLAIN
    )
    assert terms.vf_loss.item() == pytest.approx(0.5)


def test_value_clipping_takes_the_pessimistic_error():
    z = torch.zeros(1)
    value, batch = torch.tensor([2.0]), minibatch(z, z, z, torch.tensor([2.0]))
    # unclipped error 0; the prediction clipped to 0.2 has error 1.8^2: the larger is kept
    clipped = ppo_loss(batch, log_prob=z, value=value, entropy=z, mask=None, **PLAIN | {"vf_clip_coef": 0.2})
    assert clipped.vf_loss.item() == pytest.approx(0.5 * 1.8**2)
    assert ppo_loss(batch, log_prob=z, value=value, entropy=z, mask=None, **PLAIN).vf_loss.item() == 0.0


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
