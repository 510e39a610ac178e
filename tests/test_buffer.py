"""Rollout storage: layout, transition view, the flat sampler; episode bookkeeping over a rollout."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.buffers import FlatSampler, RolloutBuffer, transition_view
from shoal.collect import EpisodeTracker
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec


def make_buffer(n=4, t=6, fields=None):
    env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (3,))), action_spec(gym.spaces.Discrete(2)), n, 1)
    return RolloutBuffer(env, t, fields or {})


def test_layout_is_n_by_t_plus_one():
    buf = make_buffer(fields={"value": ((), torch.float32), "q": ((2,), torch.float64)})
    ro = buf.start_rollout()
    assert ro.batch_size == torch.Size([4, 7])
    assert ro["obs"].shape == (4, 7, 3) and ro["action"].dtype == torch.int64
    assert ro["q"].shape == (4, 7, 2) and ro["q"].dtype == torch.float64  # an algorithm's own fields
    with pytest.raises(RuntimeError, match="before a rollout was added"):
        buf.get()
    buf.add(ro)
    assert buf.get(flatten=True).batch_size == torch.Size([24])
    assert buf.get(flatten=False).batch_size == torch.Size([4, 6])


def test_transition_view_drops_only_the_padding_slot():
    buf = make_buffer()
    ro = buf.start_rollout()
    ro["reward"].copy_(torch.arange(28.0).reshape(4, 7))
    view = transition_view(ro)
    assert torch.equal(view["reward"], ro["reward"][:, :6])
    flat = transition_view(ro, flatten=True)
    assert torch.equal(flat["reward"], ro["reward"][:, :6].reshape(-1))


def test_minibatches_cover_every_transition_once():
    buf = make_buffer()
    ro = buf.start_rollout()
    ro["reward"].copy_(torch.arange(28.0).reshape(4, 7))
    steps = transition_view(ro)
    flat = transition_view(ro, flatten=True)
    seen = torch.cat([mb["reward"] for mb in FlatSampler(steps, 6, torch.Generator().manual_seed(0))])
    assert sorted(seen.tolist()) == sorted(flat["reward"].tolist())
    assert [mb.batch_size[0] for mb in FlatSampler(steps, 24)] == [24]
    # 5 does not divide 24: the nearest count of near-equal minibatches, every transition once
    sizes = [mb.batch_size[0] for mb in FlatSampler(steps, 5, torch.Generator().manual_seed(0))]
    assert sizes == [5, 5, 5, 5, 4]
    assert [mb.batch_size[0] for mb in FlatSampler(steps, 7)] == [8, 8, 8]


def test_a_policy_mask_selects_its_steps_and_each_epoch_reshuffles():
    buf = make_buffer()
    ro = buf.start_rollout()
    ro["reward"].copy_(torch.arange(28.0).reshape(4, 7))
    steps = transition_view(ro)
    select = torch.zeros(4, 6, dtype=torch.bool)
    select[1] = select[3, :2] = True  # a policy that owns row 1 and the first two steps of row 3
    sampler = FlatSampler(steps, 4, torch.Generator().manual_seed(0), select)
    epochs = [torch.cat([mb["reward"] for mb in sampler]).tolist() for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == [7.0, 8, 9, 10, 11, 12, 21, 22]
    assert epochs[0] != epochs[1]


def test_add_rejects_foreign_storage():
    buf = make_buffer()
    buf.start_rollout()
    with pytest.raises(ValueError, match="start_rollout"):
        buf.add(make_buffer().start_rollout())


def test_episode_tracker_block_equals_step_by_step():
    """EpisodeTracker.add over whole rollouts against a per-step, per-row reference loop."""
    rng = np.random.default_rng(0)
    rows, horizon, blocks = 5, 9, 4
    tracker = EpisodeTracker(rows, window=1000)
    ret, length, want_returns, want_lengths = [0.0] * rows, [0] * rows, [], []
    for _ in range(blocks):
        reward = rng.normal(size=(horizon, rows)).astype(np.float32)
        done = rng.random((horizon, rows)) < 0.3  # several episodes per row and block
        valid = rng.random((horizon, rows)) < 0.9
        tracker.add(reward, done, valid)
        for t in range(horizon):
            for r in range(rows):
                ret[r] += float(reward[t, r])  # every reward counts (turn-based games credit waiting agents)
                length[r] += int(valid[t, r])  # a step counts where the row acted
                if done[t, r]:  # acted or not (a game ending on another agent's move)
                    want_returns.append(ret[r])
                    want_lengths.append(length[r])
                    ret[r], length[r] = 0.0, 0
    assert list(tracker.returns) == pytest.approx(want_returns, abs=1e-9)
    assert list(tracker.lengths) == want_lengths
    assert tracker.ret == pytest.approx(ret, abs=1e-9) and tracker.len.tolist() == length
    assert tracker.summarize()["episodes_this_iter"] == len(want_returns)
