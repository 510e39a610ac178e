"""The learner's fused replay of segments (``cores.run_segments``: the core over whole segments in
one call, cut at episode starts) against the plain one (``RecurrentModel.unroll``: one cell step
per time step, the state zeroed where an episode starts): the same log-probabilities, values and
gradients, on segments with episode starts anywhere, rows that start an episode at every step
(as padding rows do), previous actions and rewards, LSTM and GRU, one tower or two."""

import gymnasium as gym
import pytest
import torch

from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from shoal.models.catalog import build_model
from shoal.models.cores import cut_at_resets
from shoal.models.distributions import make_distribution
from shoal.models.recurrent import RecurrentActorCriticPolicy

SEGMENTS, LENGTH, OBS = 7, 12, 3


def episode_starts() -> torch.Tensor:
    """``first [S, L]``: a row of each kind the learner meets."""
    first = torch.zeros(SEGMENTS, LENGTH, dtype=torch.bool)
    first[1, 0] = True  # starts an episode
    first[2, [4, 9]] = True  # two episodes start inside it
    first[3, [0, 5, 6, 11]] = True  # a one-step episode, one starting at the last step
    first[4] = True  # an episode start at every step (a padding row)
    first[5, 1:] = torch.rand(LENGTH - 1, generator=torch.Generator().manual_seed(0)) < 0.3
    return first  # rows 0 and 6: no episode starts, replayed whole from their start states


def policy_for(core: str, layout: dict, space: gym.Space) -> RecurrentActorCriticPolicy:
    env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (OBS,))), action_spec(space), SEGMENTS, 1)
    act = action_spec(space)
    model = build_model("mlp", {"core": core, "core_size": 16, **layout}, env, make_distribution(act).param_dim)
    return RecurrentActorCriticPolicy(model, act)


def plain(policy: RecurrentActorCriticPolicy, obs, action, first, start, reward):
    """``evaluate_segments`` through the step-by-step replay."""
    out = policy.model.unroll(obs, start, first, action, reward)[0]
    params, value = policy.model.heads(out)
    logp, ent = policy.score(params.flatten(0, 1), action.flatten(0, 1), True, None)
    return logp.view(first.shape), ent.view(first.shape), value


@pytest.mark.parametrize("core", ["lstm", "gru"])
@pytest.mark.parametrize(
    "layout,space",
    [
        ({}, gym.spaces.Discrete(3)),  # actor and critic each with a core
        ({"shared_trunk": True}, gym.spaces.Discrete(3)),  # one core for both heads
        ({"use_prev_action": True, "use_prev_reward": True}, gym.spaces.Discrete(3)),
        ({"hiddens": [], "head_hiddens": [8], "use_prev_action": True}, gym.spaces.Box(-1, 1, (2,))),
    ],
)
def test_the_fused_replay_equals_the_step_by_step_one(core, layout, space):
    torch.manual_seed(1)
    policy = policy_for(core, layout, space)
    first = episode_starts()
    obs = torch.randn(SEGMENTS, LENGTH, OBS)
    obs[4] = 0.0  # a padding row's observations
    action = torch.stack([torch.as_tensor(space.sample()) for _ in range(SEGMENTS * LENGTH)]).view(
        SEGMENTS, LENGTH, *space.shape
    )
    reward = torch.randn(SEGMENTS, LENGTH)
    start = policy.initial_state(SEGMENTS)
    for tensor in start.values():
        tensor.normal_()
    weights = torch.randn(3, SEGMENTS, LENGTH)

    results = []
    for replay in (plain, None):
        policy.zero_grad()
        if replay is None:
            logp, ent, value = policy.evaluate_segments(obs, action, first, start, entropy=True, reward=reward)
        else:
            logp, ent, value = replay(policy, obs, action, first, start, reward)
        (weights[0] * logp + weights[1] * ent + weights[2] * value).sum().backward()
        grads = {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), value.detach(), grads))
    (*want, want_grads), (*got, got_grads) = results
    for name, a, b in zip(("log-prob", "entropy", "value"), want, got):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), f"{name}: {(a - b).abs().max()}"
    assert want_grads.keys() == got_grads.keys()
    assert any(name.startswith("model.cells") for name in got_grads)
    for name, a in want_grads.items():
        assert torch.allclose(a, got_grads[name], atol=1e-6, rtol=1e-5), (
            f"grad {name}: {(a - got_grads[name]).abs().max()}"
        )


def test_segments_are_cut_into_pieces_at_every_episode_start():
    first = episode_starts()
    pieces = cut_at_resets(first)
    starts = first.clone()
    starts[:, 0] = True
    assert len(pieces.segment) == int(starts.sum())  # one piece per episode start, and per segment start
    # every step has its own place in the padded rows, and a piece's steps are consecutive in it
    assert len(set(pieces.place.tolist())) == SEGMENTS * LENGTH
    assert pieces.longest == LENGTH  # rows 0 and 6 run whole
    # only a segment's first piece, when no episode starts there, continues from its start state
    segment = pieces.segment.tolist()  # pieces in segment order
    opens = [i == 0 or segment[i - 1] != s for i, s in enumerate(segment)]
    assert pieces.carried.tolist() == [o and not bool(first[s, 0]) for o, s in zip(opens, segment)]
