"""Sequence replay and recurrent DQN: windows and their start states against slow references
(random episodes, and a recurrent policy stepped by hand), windows never crossing the head or
unwritten columns, per-sequence priorities, no gradient into the burn-in, the learner's targets
against a step-by-step computation, config errors, exact resume, and a memory task that a
recurrent Q-network learns and a feedforward one cannot."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from test_replay import GAMMA, FakeEnvs, env_info, lost_finals

import shoal
from shoal.algos.off_policy import transitions
from shoal.buffers import PrioritizedSequenceReplayBuffer, SequenceReplayBuffer
from shoal.config import DQNConfig
from shoal.errors import ConfigError
from tests.conftest import assert_resume_is_bit_identical

QUIET = dict(save_outputs=False, verbose=0)
# CartPole cut at 7 steps: episodes start (and are truncated) inside most sequences
SEQUENCES = dict(
    env="CartPole-v1",
    env_config={"max_episode_steps": 7},
    model_config={"core": "lstm", "core_size": 8, "hiddens": [16]},
    num_envs=2,
    rollout_fragment_length=8,
    replay_sequence_length=6,
    replay_burn_in=2,
    buffer_size=2 * 40,
    learning_starts=64,
    timesteps_per_iteration=64,
    gradient_steps=2,
    sgd_minibatch_size=16,
    seed=0,
    **QUIET,
)


class MaskedPair(shoal.MultiAgentEnv):
    """Two agents that move together, each with 3 actions of which a random 1-3 are legal; the
    episode ends after 8 steps."""

    def __init__(self):
        self.possible_agents = self.agents = ["p0", "p1"]
        space = gym.spaces.Dict(
            {"observation": gym.spaces.Box(-1.0, 1.0, (2,)), "action_mask": gym.spaces.MultiBinary(3)}
        )
        self.observation_spaces = dict.fromkeys(self.agents, space)
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(3))
        self.rng = np.random.default_rng(0)

    def _obs(self):
        masks = self.rng.random((2, 3)) < 0.6
        masks[:, 0] |= ~masks.any(1)
        return {
            a: {"observation": np.array([i, self.t / 8], np.float32), "action_mask": masks[i].astype(np.int8)}
            for i, a in enumerate(self.agents)
        }

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict):
        self.t += 1
        over = {"__all__": self.t >= 8}
        return self._obs(), {a: float(action_dict[a] == 0) for a in action_dict}, over, {"__all__": False}, {}


def fake_buffer(rows: int, length: int, burn_in: int, columns: int, **kw) -> SequenceReplayBuffer:
    """A buffer over ``FakeEnvs`` rows whose "state" is one number: ``add_rollout`` stores there the
    serial of the observation at each state column, so a window's start state names its first step."""
    kind = PrioritizedSequenceReplayBuffer if "alpha" in kw else SequenceReplayBuffer
    initial = [TensorDict({"h": torch.zeros(1, 1)}, batch_size=[1])]
    return kind(env_info(rows), rows * columns, initial_states=initial, sequence_length=length, burn_in=burn_in, **kw)


def add_rollout(buffer: SequenceReplayBuffer, envs: FakeEnvs, horizon: int) -> None:
    rollout, truncations = envs.rollout(horizon)
    staged = buffer.rollout_states(horizon)[0]
    staged["h"][..., 0] = rollout["obs"][:, : horizon : buffer.stride, 1]
    buffer.add(rollout, truncations)


def stored_columns(buffer: SequenceReplayBuffer) -> list[int]:
    """The columns holding stored steps, oldest first."""
    return [(buffer.head - 1 - age) % buffer.columns for age in range(buffer.size)][::-1]


@pytest.mark.parametrize(
    ("next_step", "side", "n_step", "length", "burn_in"),
    [(False, None, 1, 6, 2), (False, None, 3, 6, 2), (False, 2, 3, 5, 0), (True, None, 4, 7, 3)],
)
def test_windows_match_a_slow_reference(next_step, side, n_step, length, burn_in):
    """Each window is ``length`` consecutive stored steps starting at a state column, with that
    column's state; its n-step sums stop at episode ends and at the window's end; ``last_step`` is
    the step whose successor is ``next_obs``; the mask keeps the whole transitions past the burn-in."""
    rows, stride = 3, length - burn_in
    envs = FakeEnvs(rows, next_step, seed=n_step)
    buffer = fake_buffer(rows, length, burn_in, 31, final_obs_capacity=side)  # wraps mid-rollout
    generator = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(10):
        add_rollout(buffer, envs, 2 * stride)
        index = buffer.sample(16 * stride, generator)
        assert len(index) == 16 and bool((index % buffer.columns % stride == 0).all())
        batch = transitions(buffer, index, n_step=n_step, gamma=GAMMA)
        assert batch.batch_size == (16,) and batch["obs"].shape == (16, length, 2)
        newest = buffer.storage["obs"][:, buffer.head]
        lost = set() if next_step else lost_finals(buffer)
        sampleable = buffer.sampleable.view(-1)
        for b, start in enumerate(index.tolist()):
            row, col = divmod(start, buffer.columns)
            assert batch["start_state"]["h"][b, 0] == buffer.storage["obs"][row, col, 1]
            for t in range(length):
                obs = batch["obs"][b, t]
                assert torch.equal(obs, buffer.storage["obs"][row, (col + t) % buffer.columns])
                whole = bool(sampleable[row * buffer.columns + (col + t) % buffer.columns])
                assert bool(batch["mask"][b, t]) == (whole and t >= burn_in)
                if not whole:
                    continue
                reward, next_obs, discount = envs.reference(obs, min(n_step, length - t), newest[row], lost)
                assert batch["reward"][b, t].item() == pytest.approx(reward, abs=1e-5)
                assert batch["discount"][b, t].item() == pytest.approx(discount, abs=1e-6)
                last = int(batch["last_step"][b, t])
                assert t <= last < min(t + n_step, length)
                if discount:
                    assert torch.equal(batch["next_obs"][b, t], next_obs)
                    assert discount == pytest.approx(GAMMA ** (last - t + 1))
                else:  # the sum ended with a terminal step
                    assert bool(batch["terminated"][b, last])
                checked += 1
    assert checked > 300


def test_windows_never_cross_the_head_or_unwritten_columns():
    rows, length, burn_in = 2, 6, 2
    envs = FakeEnvs(rows, next_step=False, seed=7)
    buffer = fake_buffer(rows, length, burn_in, 40)
    with pytest.raises(RuntimeError, match="not yet a whole sequence of 6"):
        add_rollout(buffer, envs, 4)
        buffer.sample(8)
    generator = torch.Generator().manual_seed(3)
    for phase in range(20):  # filling up, then wrapping round
        add_rollout(buffer, envs, 4)
        stored = set(stored_columns(buffer))
        index = buffer.sample(4 * 2000, generator)
        starts = set()
        for start in index.tolist():
            col = start % buffer.columns
            window = [(col + t) % buffer.columns for t in range(length)]
            assert set(window) <= stored and buffer.head not in window
            starts.add(start)
        # and every window that may be drawn is drawn
        assert starts == set(buffer.sequence_drawable.view(-1).nonzero().squeeze(1).tolist()), phase


def test_prioritized_windows_enter_with_the_largest_priority_and_keep_their_own():
    rows, length, burn_in = 2, 6, 2
    envs = FakeEnvs(rows, next_step=False, seed=11)
    buffer = fake_buffer(rows, length, burn_in, 40, alpha=1.0)
    for _ in range(4):
        add_rollout(buffer, envs, 4)
    drawable = buffer.sequence_drawable.view(-1)
    leaves = buffer.sums[0][torch.arange(buffer.capacity)]
    assert torch.equal(leaves > 0, drawable) and bool((leaves[drawable] == 1.0).all())
    index = buffer.sample(8 * 4, torch.Generator().manual_seed(0))
    assert bool(drawable[index].all())
    old = index[index % buffer.columns == (buffer.head - 16) % buffer.columns]  # far enough to survive one add
    assert len(old), "stratified draws over equal priorities reach every window"
    buffer.update_priorities(index, torch.full((len(index),), 0.25))
    add_rollout(buffer, envs, 4)
    leaves = buffer.sums[0][torch.arange(buffer.capacity)]
    assert bool((leaves[old] == 0.25).all())
    newest = (buffer.head - 8) % buffer.columns  # the newest whole window, just written
    assert bool(buffer.sequence_drawable[:, newest].all()) and bool((leaves.view(rows, -1)[:, newest] == 1.0).all())


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_stored_start_states_are_the_states_the_policy_had(core):
    """Step the acting policy by hand along each row's stored steps (from zeros at an episode
    start): the table holds, at every state column, the state the row carried into that step."""
    settings = SEQUENCES | dict(learning_starts=10**9, model_config={"core": core, "core_size": 8, "hiddens": [16]})
    algo = shoal.DQN(**settings)
    for _ in range(4):  # 128 steps of each row in 40 columns: wrapped round
        algo.train()
    replay, model = algo.algorithm.replay, algo.get_policy().model
    obs, first = replay.storage["obs"], replay.storage["first"]
    checked = 0
    for row in range(replay.num_rows):
        state = None  # unknown until an episode starts in the stored steps
        for col in stored_columns(replay):
            if state is not None and col % replay.stride == 0:
                stored = replay.states[row, col // replay.stride]
                for key in model.state_keys:
                    torch.testing.assert_close(stored[key], state[key][0], atol=1e-5, rtol=0)
                checked += 1
            if first[row, col]:
                state = model.initial_state(1)
            if state is not None:
                with torch.no_grad():
                    _, _, nxt = model(obs[row, col].unsqueeze(0), state)
                state = TensorDict(dict(zip(model.state_keys, nxt)), batch_size=[1])
    assert checked >= 12


def _filled(**kw):
    algo = shoal.DQN(**(SEQUENCES | dict(learning_starts=10**9) | kw))
    for _ in range(3):
        algo.train()
    return algo


def test_burn_in_steps_get_no_gradient():
    algo = _filled()
    replay = algo.algorithm.replay
    batch = transitions(replay, replay.sample(64, torch.Generator().manual_seed(0)), n_step=3, gamma=0.99)
    obs = batch["obs"].clone().requires_grad_(True)
    batch["obs"] = obs
    algo.algorithm.learners["default_policy"].learn(batch, None)
    burn_in = replay.burn_in
    assert obs.grad is not None and not obs.grad[:, :burn_in].any()
    assert obs.grad[:, burn_in:].abs().sum(2).gt(0).float().mean() > 0.5


@pytest.mark.parametrize(
    ("double_q", "dueling", "weighted", "alpha"), [(True, True, True, 0.9), (False, False, False, 0.0)]
)
def test_the_sequence_learner_against_a_step_by_step_computation(double_q, dueling, weighted, alpha):
    """One step at a time from each stored start state (zeroed at episode starts): the learned
    steps' Q-values, their targets (the next observation valued from the state after the last
    step summed, less ``advantage_learning`` times the target core's action gap at the step), the
    weighted masked Huber loss and each sequence's eta-mixed priority."""
    algo = _filled(double_q=double_q, dueling=dueling, n_step=2, replay_priority_eta=0.7, advantage_learning=alpha)
    learner = algo.algorithm.learners["default_policy"]
    policy, replay = algo.get_policy(), algo.algorithm.replay
    with torch.no_grad():  # the target network apart from the online one
        for p in learner.target.module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch = transitions(replay, replay.sample(96, torch.Generator().manual_seed(2)), n_step=2, gamma=0.99)
    assert batch["first"][:, 1:].any(), "no episode starts inside a sequence: resets go untested"
    weights = torch.rand(len(batch), generator=torch.Generator().manual_seed(3)) + 0.5 if weighted else None
    before = copy.deepcopy(policy)
    huber, mask, priority = [], [], []
    with torch.no_grad():
        for b in range(len(batch)):
            states = {"online": [], "target": []}
            for name, model in (("online", before.model), ("target", learner.target.module)):
                state = batch["start_state"][b : b + 1]
                for t in range(replay.sequence_length):
                    _, _, nxt = model(batch["obs"][b, t : t + 1], state, batch["first"][b, t : t + 1])
                    state = TensorDict(dict(zip(model.state_keys, nxt)), batch_size=[1])
                    states[name].append(state)
            errors = []
            for t in range(replay.burn_in, replay.sequence_length):
                at, next_obs = int(batch["last_step"][b, t]), batch["next_obs"][b, t : t + 1]
                next_q = before.q_values(next_obs, learner.target.module, states["target"][at])[0]
                chooser = before.q_values(next_obs, None, states["online"][at])[0] if double_q else next_q
                discount = float(batch["discount"][b, t])
                target = batch["reward"][b, t] + (discount * next_q[chooser.argmax()] if discount else 0.0)
                obs, first = batch["obs"][b, t : t + 1], batch["first"][b, t]
                target_state = states["target"][t - 1] if t else batch["start_state"][b : b + 1]
                here = before.q_values(obs, learner.target.module, _reset(target_state, first))[0]
                target = target - alpha * (here.max() - here[batch["action"][b, t]])
                step_state = states["online"][t - 1] if t else batch["start_state"][b : b + 1]
                q = before.q_values(obs, None, _reset(step_state, first))[0]
                q = q[batch["action"][b, t]]
                huber.append(F.smooth_l1_loss(q, target) * (1.0 if weights is None else weights[b]))
                mask.append(bool(batch["mask"][b, t]))
                if mask[-1]:
                    errors.append(float((q - target).abs()))
            priority.append(0.7 * max(errors, default=0.0) + 0.3 * sum(errors) / max(len(errors), 1))
    stats, got = learner.learn(batch, weights)
    loss = sum(h for h, m in zip(huber, mask) if m) / sum(mask)
    assert stats["loss"].item() == pytest.approx(float(loss), rel=1e-4)
    torch.testing.assert_close(got, torch.tensor(priority), atol=1e-5, rtol=1e-4)


def _reset(state: TensorDict, first: torch.Tensor) -> TensorDict:
    return state.apply(torch.zeros_like) if bool(first) else state


def test_sequence_config_errors_name_the_values_and_a_fix():
    lstm = {"core": "lstm"}
    with pytest.raises(ConfigError, match="replay_burn_in=16 must be less than replay_sequence_length=16.*Try"):
        DQNConfig.build(replay_burn_in=16, model_config=lstm)
    DQNConfig.build(replay_burn_in=16)  # read only with a recurrent core
    with pytest.raises(
        ConfigError, match=r"train_freq\)=10 must be a multiple of .* 8 - 4 = 4.*Try train_freq=8 or replay_burn_in=3"
    ):
        shoal.DQN(model_config=lstm, train_freq=10, replay_sequence_length=8, replay_burn_in=4, **QUIET)
    too_short = dict(train_freq=8, replay_sequence_length=48, replay_burn_in=40, buffer_size=40)
    with pytest.raises(ConfigError, match=r"buffer_size=40 holds 40 steps .* too few .* replay_sequence_length=48"):
        shoal.DQN(model_config=lstm, **too_short, **QUIET)
    with pytest.raises(ConfigError, match=r"buffer_size=70 holds 64 steps .* collection phase \(train_freq=64\)"):
        shoal.DQN(model_config=lstm, train_freq=64, buffer_size=70, **QUIET)  # more than a phase, not in strides
    shoal.DQN(train_freq=10, replay_sequence_length=8, replay_burn_in=4, **QUIET)  # feedforward: no sequences
    with pytest.raises(
        ConfigError,
        match="cannot replay these sequences: 'pettingzoo:pettingzoo.classic.connect_four_v3' is turn-based.*algo=ppo",
    ):
        shoal.DQN(env="pettingzoo:pettingzoo.classic.connect_four_v3", model_config=lstm, **QUIET)
    pair = dict(env=MaskedPair, **QUIET)
    with pytest.raises(ConfigError, match=r"\['p1'\] have no recurrent core while \['p0'\] do"):
        shoal.DQN(policies={"p0": {"model_config": lstm}, "p1": {}}, **pair)
    sizes = {"p0": {"model_config": {"core": "gru", "core_size": 8}}, "p1": {"model_config": lstm}}
    with pytest.raises(ConfigError, match="one state table.*the same core and core_size"):
        shoal.DQN(policies=sizes, **pair)
    envs = FakeEnvs(1, next_step=False, seed=0)
    with pytest.raises(ValueError, match=r"rollout_states\(8\)"):
        fake_buffer(1, 6, 2, 40).add(*envs.rollout(8))


def test_each_recurrent_policy_replays_its_own_sequences():
    """Two recurrent policies on a two-agent env (with action masks): each learns, from windows that
    start on its own rows, with the state its own core had there."""
    algo = shoal.DQN(**(SEQUENCES | dict(env=MaskedPair, env_config={}, num_envs=1)), policies=["p0", "p1"])
    result = algo.train()
    assert {"p0/loss", "p1/loss"} <= set(result["learner"])
    replay = algo.algorithm.replay
    for owner in (0, 1):
        batch = transitions(
            replay, replay.sample(64, torch.Generator().manual_seed(owner), owner), n_step=1, gamma=0.99
        )
        assert bool((batch["policy_id"][:, 0] == owner).all())
        assert batch["next_action_mask"].shape == (len(batch), replay.sequence_length, 3)
    horizon = algo.algorithm.rollout.horizon  # the last phase's state columns, and what each policy stored there
    columns = (replay.head - horizon + torch.arange(0, horizon, replay.stride)) % replay.columns
    for owner, staged in enumerate(replay.rollout_states(horizon)):
        mine = replay.storage["policy_id"][:, columns[0]] == owner
        assert torch.equal(replay.states["h"][mine][:, columns // replay.stride], staged["h"][mine])
        assert not torch.equal(replay.states["h"][~mine][:, columns // replay.stride], staged["h"][~mine])


@pytest.mark.parametrize("prioritized", [False, True])
def test_resume_with_the_sequence_buffer_is_bit_identical(tmp_path, prioritized):
    kw = dict(SEQUENCES, store_buffer_in_checkpoints=True, prioritized_replay=prioritized, n_step=3, double_q=True)
    kw.pop("save_outputs")
    keys = ("loss", "q_mean", "td_error", "epsilon", "episode_reward_mean", "replay_size")
    # the weights and results match only if the state table came back whole
    assert_resume_is_bit_identical(shoal.DQN, kw, tmp_path, keys, iterations=5, split=3)


class CueRecall(gym.Env):
    """A cue (one of two) in the first observation, then blank steps, then a query: the action taken
    at the query earns 1 if it names the cue, -1 otherwise. Without memory the best is a coin flip."""

    def __init__(self, config: dict | None = None, delay: int = 4):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)  # [cue 0, cue 1, query]
        self.action_space = gym.spaces.Discrete(2)
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return np.eye(3, dtype=np.float32)[self.cue], {}

    def step(self, action):
        self.t += 1
        if self.t <= self.delay:
            return np.array([0, 0, self.t == self.delay], np.float32), 0.0, False, False, {}
        return np.zeros(3, np.float32), 1.0 if int(action) == self.cue else -1.0, True, False, {}


@pytest.mark.slow  # a learning run
def test_recurrent_dqn_learns_to_recall_a_cue_a_feedforward_one_cannot():
    """3000 steps: the LSTM answers every query right (seeds 0-4 all score 1.0); the MLP scores
    about 0, a coin flip (-0.1 here)."""
    settings = dict(
        env=CueRecall,
        rollout_fragment_length=8,
        gradient_steps=2,
        learning_starts=200,
        buffer_size=5000,
        sgd_minibatch_size=64,
        replay_sequence_length=12,
        replay_burn_in=4,
        learning_rate=1e-3,
        exploration_fraction=0.3,
        exploration_final_eps=0.05,
        target_update_interval=100,
        gamma=0.9,
        timesteps_per_iteration=500,
        seed=1,
        **QUIET,
    )
    returns = {}
    for name, model_config in (
        ("lstm", {"hiddens": [32], "core": "lstm", "core_size": 32}),
        ("mlp", {"hiddens": [32]}),
    ):
        algo = shoal.DQN(model_config=model_config, **settings)
        algo.learn(3000)
        returns[name] = algo.evaluate(40)["episode_reward_mean"]
    assert returns["lstm"] >= 0.9 and returns["mlp"] <= 0.5, returns
