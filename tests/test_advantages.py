"""GAE (``shoal.algos.returns.gae``) against a plain per-row Python loop, with terminated and
truncated steps everywhere."""

import itertools

import numpy as np
import pytest
import torch

from shoal.algos.returns import gae
from tests.conftest import folded_decisions


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
            ends = terminated[i, s] or truncated[i, s]
            running = delta if ends else delta + gamma * lam * running
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
    got = gae(
        *(torch.tensor(x, dtype=torch.float32) for x in (reward, value)),
        torch.tensor(terminated),
        torch.tensor(truncated),
        torch.tensor(final_value, dtype=torch.float32),
        gamma=gamma,
        gae_lambda=lam,
    )
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
        got = gae(
            torch.tensor(reward, dtype=torch.float32),
            torch.tensor(value, dtype=torch.float32),
            torch.tensor(terminated),
            torch.tensor(truncated),
            torch.tensor(final_value, dtype=torch.float32),
            gamma=0.97,
            gae_lambda=0.9,
        )
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)


def test_truncation_bootstraps_from_final_value_not_next_episode():
    reward = torch.tensor([[1.0]])
    value = torch.tensor([[0.0, 100.0]])  # value of the *next episode's* first obs
    final_value = torch.tensor([[5.0]])
    adv = gae(reward, value, torch.tensor([[False]]), torch.tensor([[True]]), final_value, gamma=0.5, gae_lambda=1.0)
    assert adv.item() == pytest.approx(1.0 + 0.5 * 5.0)


def test_gae_rejects_mismatched_shapes():
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"value_t has shape \(2, 3\), expected \(2, 4\)"):
        gae(r, torch.zeros(2, 3), r.bool(), r.bool(), r, gamma=0.9, gae_lambda=0.9)
    with pytest.raises(ValueError, match="truncated_t has shape"):
        gae(r, torch.zeros(2, 4), r.bool(), torch.zeros(3, 3).bool(), r, gamma=0.9, gae_lambda=0.9)


def slow_folded_gae(reward, value, terminated, truncated, final_value, valid, gamma, lam):
    """Each row's decisions listed explicitly, the non-decision steps after each folded in, then
    textbook GAE over that list. Non-decision steps get 0."""
    n, t = reward.shape
    adv = np.zeros((n, t))
    for i in range(n):
        decisions = [
            (d, total, value[i, d], next_v, cut)
            for d, total, next_v, cut in folded_decisions(i, reward, value, terminated, truncated, final_value, valid)
        ]
        running = 0.0
        for d, total, v, next_v, cut in reversed(decisions):
            delta = total + gamma * next_v - v
            running = delta if cut else delta + gamma * lam * running
            adv[i, d] = running
    return adv


def _folded_case(rng, n, t):
    """Random rows: decision density from none to all, dones of both kinds anywhere (so also on
    folded steps, right after other dones, and both at once: terminated wins)."""
    reward = rng.normal(size=(n, t))
    value = rng.normal(size=(n, t + 1))
    final_value = rng.normal(size=(n, t))
    density = rng.choice([0.0, 0.2, 0.5, 0.8, 1.0], size=(n, 1))
    valid = rng.random((n, t)) < density
    terminated, truncated = rng.random((n, t)) < 0.15, rng.random((n, t)) < 0.15
    return reward, value, terminated, truncated, final_value, valid


def _torch_gae(reward, value, terminated, truncated, final_value, gamma, lam, valid=None):
    f32 = dict(dtype=torch.float32)
    return gae(
        torch.tensor(reward, **f32),
        torch.tensor(value, **f32),
        torch.tensor(terminated),
        torch.tensor(truncated),
        torch.tensor(final_value, **f32),
        gamma=gamma,
        gae_lambda=lam,
        valid_t=None if valid is None else torch.tensor(valid),
    )


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0)])
@pytest.mark.parametrize("t", [1, 2, 9, 33])
def test_folded_gae_matches_reference_loop(gamma, lam, t):
    rng = np.random.default_rng(t)
    case = _folded_case(rng, 200, t)
    _, _, terminated, truncated, _, valid = case
    # the cases this test is for do occur: rows without a decision, dones of both kinds on folded steps
    assert (~valid).all(axis=1).any() and (terminated & ~valid).any() and (truncated & ~valid).any()
    expected = slow_folded_gae(*case, gamma, lam)
    got = _torch_gae(*case[:-1], gamma, lam, valid=case[-1])
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=1e-5)


def test_folded_gae_every_flag_pattern_on_short_rows():
    """Every valid / terminated / truncated combination of a 4-step row, so every fold, cut and
    tail case appears."""
    t = 4
    patterns = np.array(list(itertools.product(range(8), repeat=t)))  # one bit each: valid, terminated, truncated
    n = len(patterns)
    valid, terminated, truncated = (patterns & 1) > 0, (patterns & 2) > 0, (patterns & 4) > 0
    rng = np.random.default_rng(1)
    reward, value, final_value = rng.normal(size=(n, t)), rng.normal(size=(n, t + 1)), rng.normal(size=(n, t))
    case = reward, value, terminated, truncated, final_value, valid
    got = _torch_gae(*case[:-1], 0.97, 0.9, valid=valid)
    np.testing.assert_allclose(got.numpy(), slow_folded_gae(*case, 0.97, 0.9), atol=1e-5, rtol=1e-5)


def test_all_valid_mask_equals_no_mask_bit_for_bit():
    rng = np.random.default_rng(2)
    reward, value, terminated, truncated, final_value, _ = _folded_case(rng, 64, 17)
    args = reward, value, terminated, truncated, final_value, 0.99, 0.95
    assert torch.equal(_torch_gae(*args), _torch_gae(*args, valid=np.ones_like(terminated)))


def test_turn_based_loss_folds_into_the_losers_last_move():
    """Connect-four-like: row 0 moves at even steps, row 1 at odd steps. Row 1 wins at step 3:
    +1 to row 1, -1 to row 0 on that step, both done. Row 0's move at step 2 gets the -1, terminal."""
    t, gamma, lam = 4, 0.9, 0.8
    valid = torch.tensor([[True, False, True, False], [False, True, False, True]])
    reward = torch.tensor([[0.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 1.0]])
    terminated = torch.zeros(2, t, dtype=torch.bool)
    terminated[:, 3] = True
    value = torch.tensor([[0.1, 0.2, 0.3, 0.4, 7.0], [0.5, 0.6, 0.7, 0.8, 7.0]])
    adv = gae(
        reward,
        value,
        terminated,
        torch.zeros_like(terminated),
        torch.zeros(2, t),
        gamma=gamma,
        gae_lambda=lam,
        valid_t=valid,
    )
    a2 = -1.0 - 0.3  # row 0's last move: reward -1 folded in, no bootstrap
    a0 = 0.0 + gamma * 0.3 - 0.1 + gamma * lam * a2  # its previous move bootstraps from step 2, one gamma
    a3 = 1.0 - 0.8  # row 1's winning move
    a1 = 0.0 + gamma * 0.8 - 0.6 + gamma * lam * a3
    expected = torch.tensor([[a0, 0.0, a2, 0.0], [0.0, a1, 0.0, a3]])
    torch.testing.assert_close(adv, expected)


def test_folded_rewards_are_undiscounted_and_tail_folds_into_last_decision():
    valid = torch.tensor([[True, False, False]])
    reward = torch.tensor([[1.0, 2.0, 4.0]])
    value = torch.tensor([[0.5, 100.0, 100.0, 3.0]])
    no = torch.zeros(1, 3, dtype=torch.bool)
    adv = gae(reward, value, no, no, torch.zeros(1, 3), gamma=0.5, gae_lambda=1.0, valid_t=valid)
    assert adv.tolist() == [[1.0 + 2.0 + 4.0 + 0.5 * 3.0 - 0.5, 0.0, 0.0]]


def test_next_episode_does_not_fold_back_across_a_done():
    """Next-step autoreset: the decision at 0 truncates, step 1 is the reset (reward 0, invalid),
    and a reward on an invalid step after it belongs to the next episode."""
    valid = torch.tensor([[True, False, False, True]])
    reward = torch.tensor([[1.0, 0.0, 50.0, 2.0]])
    truncated = torch.tensor([[True, False, False, False]])
    value = torch.tensor([[0.5, 100.0, 100.0, 1.0, 3.0]])
    final_value = torch.tensor([[4.0, 0.0, 0.0, 0.0]])
    adv = gae(
        reward, value, torch.zeros_like(truncated), truncated, final_value, gamma=0.5, gae_lambda=1.0, valid_t=valid
    )
    assert adv.tolist() == [[1.0 + 0.5 * 4.0 - 0.5, 0.0, 0.0, 2.0 + 0.5 * 3.0 - 1.0]]


def test_truncation_on_a_folded_step_bootstraps_from_its_final_value():
    valid = torch.tensor([[True, True, False, True]])
    reward = torch.tensor([[1.0, 2.0, 3.0, 5.0]])
    truncated = torch.tensor([[False, False, True, False]])
    value = torch.tensor([[0.5, 1.0, 100.0, 2.0, 3.0]])
    final_value = torch.tensor([[0.0, 0.0, 4.0, 0.0]])
    adv = gae(
        reward, value, torch.zeros_like(truncated), truncated, final_value, gamma=0.5, gae_lambda=1.0, valid_t=valid
    )
    a1 = 2.0 + 3.0 + 0.5 * 4.0 - 1.0  # cut at the folded truncation: step 3 is the next episode
    expected = [[1.0 + 0.5 * 1.0 - 0.5 + 0.5 * a1, a1, 0.0, 5.0 + 0.5 * 3.0 - 2.0]]
    assert adv.tolist() == expected


def test_gae_rejects_mismatched_valid_shape():
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="valid_t has shape"):
        gae(
            r,
            torch.zeros(2, 4),
            r.bool(),
            r.bool(),
            r,
            gamma=0.9,
            gae_lambda=0.9,
            valid_t=torch.ones(2, 4, dtype=torch.bool),
        )
