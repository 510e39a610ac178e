"""GAE against a plain per-row Python loop, with terminated and truncated steps everywhere."""

import itertools

import numpy as np
import pytest
import torch

from shoal.algos.advantages import gae


def slow_gae(reward, value, terminated, truncated, final_value, gamma, lam):
    n, t = reward.shape
    adv = np.zeros((n, t))
    for i in range(n):
        running = 0.0
        for s in reversed(range(t)):
            if terminated[i, s]:
                next_v = 0.0
            elif truncated[i, s]:
                next_v = final_value[i, s]
            else:
                next_v = value[i, s + 1]
            delta = reward[i, s] + gamma * next_v - value[i, s]
            if terminated[i, s] or truncated[i, s]:
                running = delta
            else:
                running = delta + gamma * lam * running
            adv[i, s] = running
    return adv


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.98, 0.8), (1.0, 1.0), (0.9, 0.0)])
def test_gae_matches_reference_loop(gamma, lam):
    rng = np.random.default_rng(0)
    n, t = 64, 17
    reward = rng.normal(size=(n, t))
    value = rng.normal(size=(n, t + 1))
    final_value = rng.normal(size=(n, t))
    # every flag pattern at every position: rows cycle through none / terminated / truncated
    flags = rng.integers(0, 3, size=(n, t))
    terminated, truncated = flags == 1, flags == 2
    expected = slow_gae(reward, value, terminated, truncated, final_value, gamma, lam)
    got = gae(*(torch.tensor(x, dtype=torch.float32) for x in (reward, value)),
              torch.tensor(terminated), torch.tensor(truncated),
              torch.tensor(final_value, dtype=torch.float32), gamma, lam)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=1e-5)


def test_gae_every_single_done_position():
    """A lone terminated or truncated step at each position t of a row."""
    t = 6
    for pos, kind in itertools.product(range(t), ("terminated", "truncated")):
        reward = np.arange(1, t + 1, dtype=float)[None]
        value = np.linspace(0.5, 2.0, t + 1)[None]
        final_value = np.full((1, t), 10.0)
        terminated = np.zeros((1, t), bool)
        truncated = np.zeros((1, t), bool)
        (terminated if kind == "terminated" else truncated)[0, pos] = True
        expected = slow_gae(reward, value, terminated, truncated, final_value, 0.97, 0.9)
        got = gae(torch.tensor(reward, dtype=torch.float32), torch.tensor(value, dtype=torch.float32),
                  torch.tensor(terminated), torch.tensor(truncated),
                  torch.tensor(final_value, dtype=torch.float32), 0.97, 0.9)
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)


def test_truncation_bootstraps_from_final_value_not_next_episode():
    reward = torch.tensor([[1.0]])
    value = torch.tensor([[0.0, 100.0]])  # value of the *next episode's* first obs
    final_value = torch.tensor([[5.0]])
    adv = gae(reward, value, torch.tensor([[False]]), torch.tensor([[True]]), final_value, 0.5, 1.0)
    assert adv.item() == pytest.approx(1.0 + 0.5 * 5.0)


def test_gae_rejects_mismatched_shapes():
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"value_t has shape \(2, 3\), expected \(2, 4\)"):
        gae(r, torch.zeros(2, 3), r.bool(), r.bool(), r, 0.9, 0.9)
    with pytest.raises(ValueError, match="truncated_t has shape"):
        gae(r, torch.zeros(2, 4), r.bool(), torch.zeros(3, 3).bool(), r, 0.9, 0.9)
