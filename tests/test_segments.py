"""The segment learner: its keys and their relations (with the derived sizes of a worked
example), prioritized segment sampling, and gradient accumulation equal to one big minibatch."""

import itertools
import warnings

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

import shoal
from shoal.buffers import RolloutBuffer, SegmentSampler
from shoal.config import PPOConfig
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec
from tests.conftest import build_ppo

# ----- keys, relations, derived sizes ----------------------------------------------------------


def test_the_worked_example_of_128_agents_per_env():
    """batch 524,288 agent steps, minibatch 16,384, bptt 64, 64 envs of 128 agents on 8 workers in
    2 async groups: 32 envs per forward pass, 8,192 agent rows, 64 collection steps, 8,192
    segments, 32 minibatches of 256 segments."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 8 workers on this machine's few cores
        config = PPOConfig.build(
            num_envs=64,
            num_workers=8,
            async_factor=2,
            batch_size=524_288,
            minibatch_size=16_384,
            bptt_horizon=64,
            update_epochs=1,
        )
    config.check_batch(agents_per_env=128)
    layout = config.layout(128)
    assert config.train_batch_size == 4_096 and config.rollout_fragment_length == 64
    assert (layout.envs_per_batch, layout.agent_rows, layout.rollout_fragment_length) == (32, 8_192, 64)
    assert (layout.agent_steps, layout.segments, layout.num_minibatches, layout.minibatch_segments) == (
        524_288,
        8_192,
        32,
        256,
    )
    assert layout.optimizer_steps == 32
    text = layout.describe()
    for line in ("envs per batch          32", "segments             8,192", "minibatch segments     256"):
        assert line in text, text


def test_the_segment_learner_names_are_the_same_keys():
    config = PPOConfig.build(minibatch_size=64, update_epochs=3)
    assert (config.sgd_minibatch_size, config.num_sgd_iter) == (64, 3)
    assert PPOConfig.build(minibatch_size=64, sgd_minibatch_size=64).sgd_minibatch_size == 64
    with pytest.raises(
        shoal.ConfigError, match=r"minibatch_size=32 and sgd_minibatch_size=64 are two names of one key"
    ):
        PPOConfig.build(minibatch_size=32, sgd_minibatch_size=64)
    with pytest.raises(shoal.ConfigError, match=r"unknown config key 'minibach_size'.*Did you mean 'minibatch_size'"):
        PPOConfig.build(minibach_size=32)
    # batch_size counts agent steps: train_batch_size times the agents of each env
    config = PPOConfig.build(num_envs=4, batch_size=384, minibatch_size=128)
    config.check_batch(agents_per_env=3)
    assert (config.train_batch_size, config.rollout_fragment_length) == (128, 32)
    with pytest.raises(
        shoal.ConfigError, match=r"batch_size=384 agent steps \(3 agents per env\) is train_batch_size=128"
    ):
        PPOConfig.build(num_envs=4, batch_size=384, train_batch_size=256).check_batch(agents_per_env=3)
    with pytest.raises(shoal.ConfigError, match=r"batch_size=100 counts agent steps and must be a multiple of the 3"):
        PPOConfig.build(batch_size=100).check_batch(agents_per_env=3)


@pytest.mark.parametrize(
    "keys,message",
    [
        (
            dict(rollout_fragment_length=32, bptt_horizon=12),
            r"bptt_horizon=12 must divide rollout_fragment_length=32.*Try bptt_horizon=16",
        ),
        (
            dict(bptt_horizon=16, sgd_minibatch_size=40),
            r"sgd_minibatch_size=40 must be a multiple of bptt_horizon=16.*Try sgd_minibatch_size=48",
        ),
        (
            dict(sgd_minibatch_size=64, accumulate_minibatches=3),
            r"accumulate_minibatches=3 must divide the 4 minibatches.*Try accumulate_minibatches=4",
        ),
        (dict(sgd_minibatch_size=100), r"sgd_minibatch_size=100 must divide the 256 agent steps"),
    ],
)
def test_segment_relations_are_checked_with_a_suggestion(keys, message):
    with pytest.raises(shoal.ConfigError, match=message):
        PPOConfig.build(**keys).check_batch()


@pytest.mark.parametrize(
    ("keys", "learner"),
    [
        ({}, "PPOAlgorithm"),
        ({"bptt_horizon": 4}, "PPOAlgorithm"),  # a feedforward model with GAE: single transitions still
        ({"model_config": {"core": "gru"}}, "SegmentPPO"),
        ({"advantage_estimator": "vtrace"}, "SegmentPPO"),
        ({"prio_alpha": 0.5, "bptt_horizon": 4}, "SegmentPPO"),
        ({"accumulate_minibatches": 2}, "SegmentPPO"),
    ],
)
def test_algo_ppo_hands_what_needs_segments_to_the_segment_learner(keys, learner):
    with shoal.PPO(num_envs=4, rollout_fragment_length=16, sgd_minibatch_size=16, save_outputs=False, **keys) as algo:
        assert type(algo.algorithm).__name__ == learner
        assert isinstance(algo.algorithm, shoal.algos.PPOAlgorithm)
        assert algo.checkpoint_meta()["algo"] == "ppo"


def test_a_subclass_of_ppo_is_told_to_subclass_the_segment_learner():
    class Mine(shoal.algos.PPOAlgorithm):
        pass

    with pytest.raises(shoal.ConfigError, match=r"a recurrent model_config core needs the segment learner: subclass"):
        shoal.Trainer(algo=Mine, model_config={"core": "lstm"}, save_outputs=False, verbose=0)


def test_a_run_prints_its_batch_layout(capsys):
    with shoal.PPO(env="CartPole-v1", num_envs=4, bptt_horizon=8, sgd_minibatch_size=64, save_outputs=False) as algo:
        algo.learn(128, progress=True)
    err = capsys.readouterr().err
    assert "batch layout:" in err and "segments            16  (128 / bptt_horizon 8)" in err, err


# ----- prioritized segments --------------------------------------------------------------------


def _numbered(n: int, t: int) -> TensorDict:
    return TensorDict({"step": torch.arange(n * t).view(n, t), "valid": torch.ones(n, t, dtype=torch.bool)}, [n, t])


def test_segments_are_cut_in_order_along_each_row_with_their_start_states():
    data = _numbered(3, 8)
    states = TensorDict({"h": torch.arange(6.0).view(3, 2, 1)}, [3, 2])
    sampler = SegmentSampler(data, 4, 2, start_states=states)
    segments, starts = sampler.minibatch(torch.tensor([3, 0]))
    assert segments["step"].tolist() == [[12, 13, 14, 15], [0, 1, 2, 3]]
    assert starts["h"].squeeze(1).tolist() == [3.0, 0.0]


def test_selected_steps_keep_their_segments_and_mask_the_rest():
    data = _numbered(2, 4)
    select = torch.tensor([[True, True, False, False], [False, False, False, True]])
    sampler = SegmentSampler(data, 2, 1, select=select)
    assert sampler.data["step"].tolist() == [[0, 1], [6, 7]]
    assert sampler.data["valid"].tolist() == [[True, True], [False, True]]


def test_prio_alpha_zero_is_the_plain_shuffle():
    data, priority = _numbered(8, 8), torch.rand(16) * 10
    plain = SegmentSampler(data, 4, 4, torch.Generator().manual_seed(3))
    prio = SegmentSampler(data, 4, 4, torch.Generator().manual_seed(3))
    for (a, wa), (b, wb) in zip(plain.epoch(), prio.epoch(priority, alpha=0.0), strict=True):
        assert torch.equal(a, b) and wa is None and wb is None


def test_prioritized_draws_follow_the_priorities():
    """Chi-square test of 200 epochs of draws against p_i = w_i^alpha / sum w^alpha, each yielded
    with its p_i."""
    m, alpha = 16, 0.7
    priority = torch.linspace(0.1, 4.0, m)
    sampler = SegmentSampler(_numbered(m, 4), 4, 4, torch.Generator().manual_seed(0))
    counts = torch.zeros(m)
    p = priority.double().pow(alpha)
    p = p / p.sum()
    for _ in range(200):
        for index, probability in sampler.epoch(priority, alpha):
            counts += torch.bincount(index, minlength=m)
            assert torch.allclose(probability, p[index], rtol=1e-9)
    expected = p * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 37.7, chi2  # the 0.999 quantile of chi-square with 15 degrees of freedom
    assert counts.sum() == 200 * m  # an epoch draws as many segments as there are


def test_zero_priority_segments_are_never_drawn_and_bad_priorities_are_refused():
    sampler = SegmentSampler(_numbered(4, 2), 2, 1, torch.Generator().manual_seed(0))
    priority = torch.tensor([0.0, 1.0, 0.0, 2.0])
    drawn = torch.cat([index for _ in range(50) for index, _ in sampler.epoch(priority, 1.0)])
    assert set(drawn.tolist()) == {1, 3}
    uniform = torch.cat([index for _ in range(50) for index, _ in sampler.epoch(torch.zeros(4), 1.0)])
    assert set(uniform.tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="priority must be 4 finite non-negative numbers"):
        next(sampler.epoch(torch.tensor([1.0, -1.0, 0.0, 0.0]), 1.0))


def test_prio_beta_rises_from_beta0_to_one_by_the_last_iteration():
    betas = []

    class Watch(shoal.Callback):
        def on_train_result(self, trainer, result):
            algorithm = trainer.algorithm
            betas.append(algorithm.prio_beta(algorithm.config))

    kw = dict(num_envs=4, rollout_fragment_length=16, bptt_horizon=4, sgd_minibatch_size=16, prio_alpha=0.6)
    kw |= dict(num_sgd_iter=1)  # the schedule follows the iterations; more epochs of each update only cost time
    with shoal.PPO(prio_beta0=0.4, callbacks=[Watch()], save_outputs=False, verbose=0, **kw) as algo:
        algo.learn(10 * 64)
    assert betas[0] == pytest.approx(0.4 + 0.6 * 0.1) and betas[-1] == 1.0
    assert all(b < c for b, c in itertools.pairwise(betas))


# ----- gradient accumulation -------------------------------------------------------------------


def _rollout(env: EnvInfo, horizon: int, length: int, states: list, seed: int) -> tuple[TensorDict, TensorDict | None]:
    g = torch.Generator().manual_seed(seed)
    fields = dict.fromkeys(("sample_log_prob", "value", "final_value", "advantage", "return"), ((), torch.float32))
    buffer = RolloutBuffer(env, horizon, fields, segment_length=length, initial_states=states)
    rollout = buffer.start_rollout()
    for key in ("obs", "reward", "value", "sample_log_prob"):
        rollout[key].copy_(torch.randn(rollout[key].shape, generator=g))
    rollout["action"].copy_(torch.randint(0, 3, rollout["action"].shape, generator=g))
    rollout["terminated"].copy_(torch.rand(rollout["terminated"].shape, generator=g) < 0.1)
    rollout["done"].copy_(rollout["terminated"])
    rollout["first"][:, 1:].copy_(rollout["done"][:, :-1])
    rollout["valid"].copy_(torch.rand(rollout["valid"].shape, generator=g) < 0.9)  # padding rows too
    starts = None
    if buffer.start_states is not None:
        starts = buffer.start_states[0]
        starts["h"].copy_(torch.randn(starts["h"].shape, generator=g))
    return rollout, starts


@pytest.mark.parametrize("model", ["mlp", "gru"])
def test_accumulated_minibatches_step_like_one_big_minibatch(model):
    """4 epochs of minibatches of 16 accumulated 4 at a time equal 4 epochs of minibatches of 64,
    parameters to 1e-6: losses weighted by their share of the valid steps, advantages normalized
    over the whole step, one clip per optimizer step."""
    space = gym.spaces.Discrete(3)
    env = EnvInfo("test", obs_spec(gym.spaces.Box(-1, 1, (5,))), action_spec(space), 8, 1)
    model_config = {"hiddens": [32]} | ({"core": model, "core_size": 8} if model != "mlp" else {})
    base = dict(num_envs=8, rollout_fragment_length=16, num_sgd_iter=4, ent_coef=0.01, max_grad_norm=0.1)
    base |= dict(learning_rate=1e-3)
    base |= dict(model_config=model_config, fused_update=False, bptt_horizon=4)
    small = PPOConfig.build(**base, sgd_minibatch_size=16, accumulate_minibatches=4)
    big = PPOConfig.build(**base, sgd_minibatch_size=64)
    results, policies = [], []
    for config in (small, big):
        algo = build_ppo(config, env, torch.float64)
        learner = algo.learners["default_policy"]
        rollout, starts = _rollout(env, 16, 4, [learner.policy.initial_state(1)], seed=2)
        rollout = rollout.apply(lambda x: x.double() if x.is_floating_point() else x)
        if starts is not None:
            algo.buffer.start_states = [starts.double()]
        start = [p.detach().clone() for p in learner.policy.parameters()]
        results.append(algo.learn(learner, rollout, None))
        policies.append(learner.policy)
    assert results[0]["num_sgd_steps"] == results[1]["num_sgd_steps"] == 4 * 2
    moved = max((p - q).abs().max().item() for p, q in zip(policies[0].parameters(), start))
    assert moved > 1e-3
    for p, q in zip(policies[0].parameters(), policies[1].parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), (p - q).abs().max()
