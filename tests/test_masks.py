"""Action masks for Discrete and MultiDiscrete policies: never sample a disallowed action, the
masked distribution's log-probabilities and entropy, bad inputs, and the mask reaching PPO's
learn step (the fused backward with masks: tests/test_fused.py)."""

import gymnasium as gym
import pytest
import torch

from shoal.algos.ppo_fused import _dist_forward
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from shoal.models.distributions import Categorical, MultiCategorical
from tests.conftest import build_ppo, mlp_policy

NVECS = [(5,), (3, 4, 2)]  # Discrete(5) and MultiDiscrete([3, 4, 2])


def make_dist(nvec):
    return Categorical(nvec[0]) if len(nvec) == 1 else MultiCategorical(nvec)


def random_mask(nvec, rows: int, generator: torch.Generator) -> torch.Tensor:
    """Each sub-action keeps a random non-empty subset of its choices."""
    parts = []
    for n in nvec:
        m = torch.rand(rows, n, generator=generator) < 0.5
        m[torch.arange(rows), torch.randint(n, (rows,), generator=generator)] = True
        parts.append(m)
    return torch.cat(parts, -1)


def allowed_action(mask: torch.Tensor, nvec, generator: torch.Generator) -> torch.Tensor:
    """An allowed action per row (any action for a segment with nothing allowed)."""
    parts = []
    for m in mask.split(list(nvec), -1):
        weights = torch.where(m.any(-1, keepdim=True), m.double(), 1.0)
        parts.append(torch.multinomial(weights, 1, generator=generator).squeeze(-1))
    return torch.stack(parts, -1) if len(nvec) > 1 else parts[0]


def reference(logits: torch.Tensor, action: torch.Tensor, mask: torch.Tensor, nvec):
    """Log-probability and entropy by hand, row by row: softmax renormalized over the allowed
    actions of each sub-action; a segment with nothing allowed is unmasked."""
    logits, action = logits.double(), action.reshape(len(logits), -1)
    logp, ent = torch.zeros(len(logits), dtype=torch.float64), torch.zeros(len(logits), dtype=torch.float64)
    for row in range(len(logits)):
        start = 0
        for k, n in enumerate(nvec):
            z, m = logits[row, start : start + n], mask[row, start : start + n]
            allowed = [i for i in range(n) if m[i]] or list(range(n))
            total = sum(z[i].exp() for i in allowed)
            probs = {i: z[i].exp() / total for i in allowed}
            logp[row] += probs[int(action[row, k])].log() if int(action[row, k]) in probs else -float("inf")
            ent[row] -= sum(p * p.log() for p in probs.values())
            start += n
    return logp, ent


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("nvec", NVECS)
def test_sampling_never_picks_a_masked_action(nvec, deterministic):
    g = torch.Generator().manual_seed(0)
    dist, rows = make_dist(nvec), 10_000
    mask = random_mask(nvec, rows, g)
    # the masked actions have by far the largest logits: an unmasked sampler would pick them
    logits = torch.randn(rows, sum(nvec), generator=g) + 10.0 * (~mask)
    action, logp = dist.sample(logits, deterministic, mask)
    action = action.reshape(rows, -1)
    start = 0
    for k, n in enumerate(nvec):
        assert mask[:, start : start + n].gather(-1, action[:, k : k + 1]).all()
        start += n
    head = slice(0, 256)  # the per-row reference is slow
    assert torch.allclose(logp[head].double(), reference(logits[head], action[head], mask[head], nvec)[0], atol=1e-5)
    if deterministic:  # the mode of the masked distribution
        best = torch.cat(
            [
                x.masked_fill(~m, -float("inf")).argmax(-1, keepdim=True)
                for x, m in zip(logits.split(list(nvec), -1), mask.split(list(nvec), -1))
            ],
            -1,
        )
        assert torch.equal(action, best)


@pytest.mark.parametrize("nvec", NVECS)
def test_log_prob_and_entropy_match_renormalized_softmax(nvec):
    g = torch.Generator().manual_seed(1)
    dist, rows = make_dist(nvec), 64
    mask = random_mask(nvec, rows, g)
    mask[:3] = False  # padding rows: treated as unmasked
    logits = 3.0 * torch.randn(rows, sum(nvec), generator=g)
    action = allowed_action(mask, nvec, g)
    logp, ent = dist.log_prob_entropy(logits, action, mask=mask)
    want_logp, want_ent = reference(logits, action, mask, nvec)
    assert torch.allclose(logp.double(), want_logp, atol=1e-5)
    assert torch.allclose(ent.double(), want_ent, atol=1e-5)
    # an all-allowed mask is the unmasked distribution
    plain_logp, plain_ent = dist.log_prob_entropy(logits, action)
    full_logp, full_ent = dist.log_prob_entropy(logits, action, mask=torch.ones_like(mask))
    assert torch.equal(full_logp, plain_logp) and torch.equal(full_ent, plain_ent)


def test_masked_action_has_probability_zero_and_entropy_stays_finite():
    mask = torch.tensor([[True, False, True], [False, True, False]])
    logits = torch.tensor([[0.0, 50.0, 1.0], [3.0, -2.0, 80.0]])
    dist = Categorical(3)
    logp, ent = dist.log_prob_entropy(logits, torch.tensor([1, 0]), mask=mask)
    assert logp.exp().tolist() == [0.0, 0.0]
    # the second row has one allowed action: a certain outcome, zero entropy (not NaN)
    assert torch.isfinite(ent).all() and ent[1].item() == 0.0


def test_act_respects_the_mask():
    torch.manual_seed(4)
    policy = mlp_policy(3, gym.spaces.MultiDiscrete([3, 2]), hiddens=[8])
    obs = torch.randn(200, 3)
    action_mask = torch.tensor([False, False, True, True, False]).expand(200, 5)
    first = torch.ones(200, dtype=torch.bool)
    for deterministic in (False, True):
        action, extras, _ = policy.act(obs, policy.initial_state(200), first, action_mask, deterministic=deterministic)
        assert action.tolist() == [[2, 0]] * 200
        assert extras["sample_log_prob"].abs().max().item() < 1e-6  # a forced choice: probability 1


@pytest.mark.parametrize("nvec,width", [((5,), 4), ((3, 4), 8)])
def test_wrong_mask_shape_names_both_shapes(nvec, width):
    dist = make_dist(nvec)
    logits = torch.zeros(6, sum(nvec))
    action = torch.zeros(6, len(nvec), dtype=torch.long).squeeze(-1)
    expected = rf"shape \(6, {width}\), expected \(6, {sum(nvec)}\)"
    with pytest.raises(ValueError, match=expected):
        dist.sample(logits, mask=torch.ones(6, width, dtype=torch.bool))
    with pytest.raises(ValueError, match=expected):
        dist.log_prob_entropy(logits, action, mask=torch.ones(6, width, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"shape \(5, "):  # a wrong batch size too
        dist.sample(logits, mask=torch.ones(5, sum(nvec), dtype=torch.bool))


def test_non_bool_mask_is_rejected():
    # PettingZoo masks are int8: ~ on them is a bitwise not, not a logical one
    with pytest.raises(ValueError, match="bool tensor.*int8"):
        Categorical(3).sample(torch.zeros(2, 3), mask=torch.ones(2, 3, dtype=torch.int8))


def test_mask_on_a_box_policy_raises():
    policy = mlp_policy(3, gym.spaces.Box(-1.0, 1.0, (2,)), hiddens=[8])
    obs, action, mask = torch.zeros(4, 3), torch.zeros(4, 2), torch.ones(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="continuous"):
        policy.act(obs, policy.initial_state(4), torch.ones(4, dtype=torch.bool), mask)
    with pytest.raises(ValueError, match="continuous"):
        policy.evaluate(obs, action, action_mask=mask)
    with pytest.raises(ValueError, match="continuous"):
        _dist_forward(policy, torch.zeros(4, 2), action, True, mask)


@pytest.mark.parametrize("fused", [True, False])
def test_ppo_update_uses_the_rollout_action_mask(fused):
    """Every row allows one action: under the mask the policy is certain, so the entropy PPO
    reports is 0; without the key it is not."""

    def entropy_after_update(with_mask: bool) -> float:
        space = gym.spaces.Discrete(4)
        config = PPOConfig(
            env="CartPole-v1",
            num_envs=4,
            rollout_fragment_length=8,
            sgd_minibatch_size=8,
            num_sgd_iter=2,
            fused_update=fused,
            model_config={"hiddens": [8]},
        )
        env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (2,))), action_spec(space), 4, 1)
        algo = build_ppo(config, env)
        rollout = algo.buffer.start_rollout()
        torch.manual_seed(5)
        rollout["obs"].normal_()
        rollout["reward"].normal_()
        rollout["action"].fill_(2)
        if with_mask:
            rollout["action_mask"] = torch.nn.functional.one_hot(rollout["action"], 4).bool()
        return algo.learn(algo.learners["default_policy"], rollout, None)["entropy"]

    assert entropy_after_update(with_mask=True) == 0.0
    assert entropy_after_update(with_mask=False) > 1.0
