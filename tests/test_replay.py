"""The replay buffer against a slow reference: n-step returns that stop at episode ends, bootstrap
from a truncated episode's true final observation, and never cross the newest stored step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from shoal.algos.off_policy import transitions
from shoal.algos.returns import importance_weights
from shoal.buffers import PrioritizedReplayBuffer, ReplayBuffer
from shoal.collect.collector import Truncations
from shoal.envs.spaces import EnvInfo, action_spec, obs_spec

GAMMA = 0.9


def env_info(rows: int) -> EnvInfo:
    return EnvInfo("fake", obs_spec(gym.spaces.Box(-1e9, 1e9, (2,))), action_spec(gym.spaces.Discrete(3)), rows, 1)


class FakeEnvs:
    """Random episodes on ``rows`` rows, delivered as the collector's ``[N, T+1]`` rollouts.

    Observations name their step: ``(row, serial)`` with a fresh serial per observation, and a
    truncated episode's true final observation is ``(row, -serial)``. ``true_steps[row]`` lists
    every transition ``(obs, reward, terminated, truncated, next_obs)`` in order."""

    def __init__(self, rows: int, next_step: bool, seed: int):
        self.rows, self.next_step = rows, next_step
        self.rng = np.random.default_rng(seed)
        self.serial = 0
        self.obs = [self._new(r) for r in range(rows)]
        self.first = [True] * rows
        self.resetting = [False] * rows  # next_step: this step only resets (not a transition)
        self.true_steps: list[list[tuple[torch.Tensor, float, bool, bool, torch.Tensor]]] = [[] for _ in range(rows)]

    def _new(self, row: int, sign: float = 1.0) -> torch.Tensor:
        self.serial += 1
        return torch.tensor([row, sign * self.serial], dtype=torch.float32)

    def rollout(self, horizon: int) -> tuple[TensorDict, Truncations]:
        n = self.rows
        td = TensorDict(
            {
                "obs": torch.zeros(n, horizon + 1, 2),
                "action": torch.zeros(n, horizon + 1, dtype=torch.long),
                "reward": torch.zeros(n, horizon + 1),
                "done": torch.zeros(n, horizon + 1, dtype=torch.bool),
                "terminated": torch.zeros(n, horizon + 1, dtype=torch.bool),
                "truncated": torch.zeros(n, horizon + 1, dtype=torch.bool),
                "first": torch.zeros(n, horizon + 1, dtype=torch.bool),
                "valid": torch.ones(n, horizon + 1, dtype=torch.bool),
                "policy_id": torch.zeros(n, horizon + 1, dtype=torch.long),
            },
            batch_size=[n, horizon + 1],
        )
        trunc_rows, trunc_steps, finals = [], [], []
        for t in range(horizon + 1):
            for r in range(n):
                td["obs"][r, t] = self.obs[r]
                td["first"][r, t] = self.first[r]
                if t == horizon:
                    continue
                td["action"][r, t] = int(self.rng.integers(3))
                if self.resetting[r]:  # next-step autoreset: the step that only resets the env
                    td["valid"][r, t] = False
                    self.resetting[r] = False
                    self.obs[r], self.first[r] = self._new(r), True
                    continue
                reward = float(self.rng.normal())
                end = self.rng.random()
                terminated, truncated = end < 0.08, 0.08 <= end < 0.2
                td["reward"][r, t], td["terminated"][r, t], td["truncated"][r, t] = reward, terminated, truncated
                td["done"][r, t] = terminated or truncated
                nxt = self._new(r, -1.0 if truncated else 1.0)
                self.true_steps[r].append((self.obs[r], reward, terminated, truncated, nxt))
                self.first[r] = False
                if truncated and not self.next_step:
                    trunc_rows.append(r)
                    trunc_steps.append(t)
                    finals.append(nxt)
                    self.obs[r], self.first[r] = self._new(r), True
                elif (terminated or truncated) and self.next_step:
                    self.obs[r], self.resetting[r] = nxt, True
                elif terminated:
                    self.obs[r], self.first[r] = self._new(r), True
                else:
                    self.obs[r] = nxt
        obs = torch.stack(finals) if finals else torch.zeros(0, 2)
        truncations = Truncations(
            torch.tensor(trunc_rows, dtype=torch.long),
            torch.tensor(trunc_steps, dtype=torch.long),
            obs,
            None,
            [],
            next_step=self.next_step,
        )
        return td, truncations

    def reference(
        self, obs: torch.Tensor, n_step: int, newest: torch.Tensor, lost: set[float]
    ) -> tuple[float, torch.Tensor, float]:
        """(n-step reward, next obs, discount) of the transition from ``obs``: up to ``n_step``
        rewards, stopping at an episode end, after the newest stored step's observation ``newest``,
        and before a truncated step whose final observation the buffer lost (``lost``: their obs
        serials)."""
        steps = self.true_steps[int(obs[0])]
        at = next(i for i, s in enumerate(steps) if torch.equal(s[0], obs))
        reward, discount, next_obs = 0.0, 1.0, obs
        for k in range(n_step):
            o, r, terminated, truncated, nxt = steps[at + k]
            if k and truncated and float(o[1]) in lost:
                break
            reward += discount * r
            discount *= GAMMA
            next_obs = nxt
            if terminated:
                return reward, nxt, 0.0
            if truncated or torch.equal(nxt, newest) or at + k + 1 == len(steps):
                break
        return reward, next_obs, discount


def lost_finals(buffer: ReplayBuffer) -> set[float]:
    """Serials of the stored truncated steps whose final observation the side table dropped."""
    stored = buffer.storage["truncated"] & (buffer.final_slot < 0)
    return {float(o[1]) for o in buffer.storage["obs"][stored]}


@pytest.mark.parametrize(
    ("next_step", "side", "n_step"),
    [(False, None, 1), (False, None, 3), (False, 2, 3), (True, None, 1), (True, None, 4)],
)
def test_nstep_returns_match_reference(next_step: bool, side: int | None, n_step: int) -> None:
    rows, horizon = 3, 5
    envs = FakeEnvs(rows, next_step, seed=n_step)
    buffer = ReplayBuffer(env_info(rows), rows * 23, final_obs_capacity=side)  # 23 columns: wraps mid-rollout
    generator = torch.Generator().manual_seed(0)
    checked = 0
    for _ in range(12):
        buffer.add(*envs.rollout(horizon))
        index = buffer.sample(64, generator)
        batch = transitions(buffer, index, n_step=n_step, gamma=GAMMA)
        newest = buffer.storage["obs"][:, buffer.head]
        lost = set() if next_step else lost_finals(buffer)
        for i in range(len(index)):
            obs = batch["obs"][i]
            assert float(obs[1]) > 0, "a sampled step is a real observation"
            reward, next_obs, discount = envs.reference(obs, n_step, newest[int(obs[0])], lost)
            assert batch["reward"][i].item() == pytest.approx(reward, abs=1e-5)
            assert batch["discount"][i].item() == pytest.approx(discount, abs=1e-6)
            if discount:  # after a terminal step nothing is bootstrapped: any next_obs will do
                assert torch.equal(batch["next_obs"][i], next_obs)
            checked += 1
    assert checked == 12 * 64
    if side is not None:
        assert lost, "the small side table must have dropped some final observations"
        sampled = buffer.storage["obs"].view(-1, 2)[buffer.sample(500, generator)]
        assert not {float(o[1]) for o in sampled} & lost, "a step without its final observation was sampled"


def test_only_stored_transitions_are_sampled() -> None:
    """Never the head (the newest observation, not a step yet) nor a next-step reset step."""
    rows = 2
    envs = FakeEnvs(rows, next_step=True, seed=3)
    buffer = ReplayBuffer(env_info(rows), rows * 40)
    for _ in range(5):
        buffer.add(*envs.rollout(6))
    index = buffer.sample(2000, torch.Generator().manual_seed(1))
    col = index % buffer.columns
    assert not bool((col == buffer.head).any())
    assert bool(buffer.storage["valid"].view(-1)[index].all())
    stored = (buffer.head - 1 - torch.arange(buffer.size)) % buffer.columns
    assert set(col.tolist()) <= set(stored.tolist())


def episode_under_way(envs: FakeEnvs, horizon: int, reward: float) -> TensorDict:
    """A rollout of ``horizon`` steps in which no episode ends, each step's reward ``reward``."""
    rollout, _ = envs.rollout(horizon)
    for key in ("done", "terminated", "truncated"):
        rollout[key][:] = False
    rollout["reward"][:] = reward
    return rollout


@pytest.mark.parametrize("how", ["the envs were reset", "the buffer came from another run"])
def test_a_rollout_that_does_not_go_on_from_the_stored_rows_unlinks_them(how: str) -> None:
    """The step before it has no next observation any more: it is not drawn, and an n-step return
    from an earlier step stops after the step before it, bootstrapping from its own episode's
    observation (not summing the next rollout's rewards)."""
    envs = FakeEnvs(1, next_step=False, seed=0)
    buffer = ReplayBuffer(env_info(1), 50)
    buffer.add(episode_under_way(envs, 4, 1.0), None)
    assert bool(buffer.sampleable[0, 3])
    old_obs = buffer.storage["obs"][0, 3].clone()
    if how == "the buffer came from another run":  # a population-based move took it: these envs go on mid-episode
        moved = ReplayBuffer(env_info(1), 50)
        moved.load_state_dict(buffer.state_dict())
        moved.unlink()
        buffer = ReplayBuffer(env_info(1), 50)  # and resumed from the checkpoint written at the move
        buffer.load_state_dict(moved.state_dict())
    restart = episode_under_way(envs, 4, 100.0)
    restart["first"][:, 0] = how == "the envs were reset"
    buffer.add(restart, None)
    assert not bool(buffer.sampleable[0, 3])
    batch = transitions(buffer, torch.tensor([2]), n_step=3, gamma=1.0)
    assert float(batch["reward"][0]) == 1.0 and float(batch["discount"][0]) == 1.0
    assert torch.equal(batch["next_obs"][0], old_obs)
    buffer.add(episode_under_way(envs, 4, 100.0), None)  # later rollouts go on from the rows again
    assert bool(buffer.sampleable[0, 7])


@pytest.mark.parametrize(
    "end, kept",
    [("terminated", True), ("truncated, final observation in the side table", True), ("truncated, next step", False)],
)
def test_a_rollout_that_does_not_go_on_keeps_an_ended_step_that_needs_no_next_column(end: str, kept: bool) -> None:
    """A terminated step has no successor, and a truncated one with same-step autoreset has its
    final observation in the side table; with next-step autoreset it is the next column, which the
    restarted rollout overwrites: that step is no transition any more, nor a bootstrap for the
    n-step returns of the steps before it."""
    envs = FakeEnvs(1, next_step=False, seed=0)
    buffer = ReplayBuffer(env_info(1), 50)
    rollout = episode_under_way(envs, 4, 1.0)
    final = torch.tensor([[0.0, -999.0]])
    rollout["terminated" if end == "terminated" else "truncated"][0, 3] = True
    rollout["done"][0, 3] = True
    one = torch.tensor([0]), torch.tensor([3])
    if end == "truncated, next step":
        rollout["obs"][0, 4] = final[0]
    truncations = Truncations(*one, final, None, [], next_step=end == "truncated, next step")
    buffer.add(rollout, truncations)
    restart = episode_under_way(envs, 4, 100.0)
    restart["first"][:, 0] = True
    buffer.add(restart, None)
    assert bool(buffer.sampleable[0, 3]) is kept
    batch = transitions(buffer, torch.tensor([1]), n_step=3, gamma=1.0)
    assert float(batch["reward"][0]) == (3.0 if kept else 2.0)  # the return stops before a lost step
    if end.startswith("truncated"):
        bootstrap = final[0] if kept else buffer.storage["obs"][0, 3]
        assert torch.equal(batch["next_obs"][0], bootstrap)


def test_an_n_step_return_stops_before_padding() -> None:
    """A row whose env group parked early (episode-paced collection with several groups) holds
    padding after its last step; a return stops there and bootstraps from the parked observation."""
    envs = FakeEnvs(2, next_step=False, seed=0)
    rollout = episode_under_way(envs, 6, 1.0)
    rollout["valid"][0, 3:6], rollout["reward"][0, 3:6] = False, 0.0
    rollout["obs"][0, 4:] = -7.0  # what the padding slots hold: not observations
    buffer = ReplayBuffer(env_info(2), 2 * 40)
    buffer.add(rollout, None)
    batch = transitions(buffer, torch.tensor([1]), n_step=4, gamma=0.5)
    assert float(batch["reward"][0]) == 1.5 and float(batch["discount"][0]) == 0.25
    assert torch.equal(batch["next_obs"][0], rollout["obs"][0, 3])


def test_uniform_sampling_frequencies() -> None:
    rows = 2
    envs = FakeEnvs(rows, next_step=False, seed=5)
    buffer = ReplayBuffer(env_info(rows), rows * 30)
    buffer.add(*envs.rollout(10))
    index = buffer.sample(60_000, torch.Generator().manual_seed(2))
    counts = torch.bincount(index, minlength=buffer.capacity).float()
    allowed = buffer.sampleable.view(-1)
    expected = 60_000 / int(allowed.sum())
    assert counts[~allowed].sum() == 0
    chi2 = float(((counts[allowed] - expected) ** 2 / expected).sum())
    dof = int(allowed.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5


def test_prioritized_sampling_follows_priorities() -> None:
    """Frequencies match priority ** alpha (chi-square); ``probabilities`` are those frequencies, and
    the weights of the off-policy learner (``importance_weights`` with ``min_probability``) are
    (P(i) / P_min) ** -beta."""
    rows, alpha = 2, 0.7
    envs = FakeEnvs(rows, next_step=False, seed=6)
    buffer = PrioritizedReplayBuffer(env_info(rows), rows * 30, alpha=alpha)
    buffer.add(*envs.rollout(12))
    stored = buffer.sampleable.view(-1).nonzero().squeeze(1)
    priority = torch.rand(len(stored), generator=torch.Generator().manual_seed(0)) * 5 + 0.1
    buffer.update_priorities(stored, priority)
    generator = torch.Generator().manual_seed(3)
    draws = torch.cat([buffer.sample(256, generator) for _ in range(400)])
    counts = torch.bincount(draws, minlength=buffer.capacity)[stored].double()
    share = priority.double() ** alpha / (priority.double() ** alpha).sum()
    expected = share * len(draws)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = len(stored) - 1
    threshold = dof + 6 * (2 * dof) ** 0.5
    assert chi2 < threshold
    uniform = torch.full_like(expected, len(draws) / len(stored))
    assert float(((counts - uniform) ** 2 / uniform).sum()) > threshold, "the test must tell priorities apart"
    torch.testing.assert_close(buffer.probabilities(stored), share)
    weights = importance_weights(
        buffer.probabilities(stored), size=len(stored), beta=0.5, min_prob=buffer.min_probability()
    )
    reference = (share / share.min()) ** -0.5
    torch.testing.assert_close(weights.double(), reference, rtol=1e-5, atol=1e-6)
    assert float(weights.max()) == pytest.approx(1.0)


def test_new_steps_enter_with_the_largest_priority() -> None:
    rows = 1
    envs = FakeEnvs(rows, next_step=False, seed=7)
    buffer = PrioritizedReplayBuffer(env_info(rows), 40, alpha=1.0)
    buffer.add(*envs.rollout(5))
    buffer.update_priorities(torch.tensor([0]), torch.tensor([9.0]))
    buffer.add(*envs.rollout(5))
    fresh = buffer.sampleable[0, 5:10]
    assert torch.equal(
        buffer.sums[0][torch.arange(5, 10)][fresh], torch.full((int(fresh.sum()),), 9.0, dtype=torch.float64)
    )
    assert float(buffer.sums[0][torch.tensor([buffer.head])]) == 0.0


def test_state_dict_round_trip() -> None:
    envs = FakeEnvs(2, next_step=False, seed=8)
    buffer = PrioritizedReplayBuffer(env_info(2), 60)
    for _ in range(3):
        buffer.add(*envs.rollout(7))
    copy = PrioritizedReplayBuffer(env_info(2), 60)
    copy.load_state_dict(buffer.state_dict())
    a = transitions(buffer, buffer.sample(32, torch.Generator().manual_seed(4)), n_step=3, gamma=GAMMA)
    b = transitions(copy, copy.sample(32, torch.Generator().manual_seed(4)), n_step=3, gamma=GAMMA)
    assert (a == b).all()


@pytest.mark.parametrize("stored_alpha", [0.3, 0.0])
def test_a_buffer_loaded_with_another_alpha_draws_by_the_new_one(stored_alpha: float) -> None:
    """A resume (or a population-based move) with a changed ``alpha``: the loaded priorities are
    what a buffer built with the new alpha holds after the same updates; from ``alpha=0``, which
    kept no priority, every drawable step takes the largest one."""
    envs = FakeEnvs(2, next_step=False, seed=10)
    rollout = envs.rollout(12)
    stored = PrioritizedReplayBuffer(env_info(2), 60, alpha=stored_alpha)
    direct = PrioritizedReplayBuffer(env_info(2), 60, alpha=0.8)
    for buffer in (stored, direct):
        buffer.add(*rollout)
    steps = direct.sampleable.view(-1).nonzero().squeeze(1)[::2]  # half the stored steps
    priority = torch.linspace(0.5, 4.0, len(steps))
    for buffer in (stored, direct):
        buffer.update_priorities(steps, priority)
    loaded = PrioritizedReplayBuffer(env_info(2), 60, alpha=0.8)
    loaded.load_state_dict(stored.state_dict())
    if stored_alpha == 0.0:  # each drawable step: the largest priority given, 4.0
        expected = torch.where(direct.sums[0].tree > 0, 4.0**0.8, 0.0).double()
        leaves = slice(direct.sums[0].leaves, None)
        torch.testing.assert_close(loaded.sums[0].tree[leaves], expected[leaves])
        return
    for mine, theirs in ((loaded.sums[0], direct.sums[0]), (loaded.mins[0], direct.mins[0])):
        torch.testing.assert_close(mine.tree, theirs.tree)
    assert loaded.probabilities(steps).sum() > stored.probabilities(steps).sum(), "the test must tell alphas apart"


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="capacity 3 cannot hold two steps of each of 2 agent rows"):
        ReplayBuffer(env_info(2), 3)
    buffer = ReplayBuffer(env_info(1), 6)
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        buffer.sample(4)
    envs = FakeEnvs(1, next_step=False, seed=9)
    with pytest.raises(ValueError, match="rollout of 6 steps per row does not fit 6 replay columns"):
        buffer.add(*envs.rollout(6))


def test_row_bytes_count_each_stored_field_and_the_next_observation() -> None:
    """What a drawn step costs to gather, which sizes a phase's gathers: uint8 images, and a Dict
    observation (stored flat as float32: 64 + 3 values)."""
    discrete = action_spec(gym.spaces.Discrete(3))
    box = ReplayBuffer(EnvInfo("box", obs_spec(gym.spaces.Box(0, 255, (84, 84), np.uint8)), discrete, 1, 1), 16)
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (8, 8), np.uint8), "x": gym.spaces.Box(-1, 1, (3,))})
    nested = ReplayBuffer(EnvInfo("dict", obs_spec(space), discrete, 1, 1), 16)
    for buffer, obs_bytes in ((box, 84 * 84), (nested, (64 + 3) * 4)):
        others = sum(t[0, 0].numel() * t.element_size() for k, t in buffer.storage.items(True, True) if "obs" not in k)
        assert buffer.row_bytes == 2 * obs_bytes + others
