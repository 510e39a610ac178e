"""batch_mode='complete_episodes': every row of a rollout ends at an episode end, no step is lost
or delivered twice, episodes are counted once, and the combinations that make no sense are refused."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from examples.reinforce import Reinforce
from shoal.buffers import RolloutBuffer
from shoal.errors import ConfigError, EnvError

COMPLETE = dict(batch_mode="complete_episodes", save_outputs=False, verbose=0, tuned=False)


class RandomLengthEnv(gym.Env):
    """obs = [steps this env has taken in all], so the stored observations of a row count 0, 1,
    2, ... exactly when every step is delivered once and in order. Episodes last 1 to 40 steps,
    drawn from the env's seeded generator; they end by termination."""

    def __init__(self, longest: int = 40):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.longest, self.count, self.left = longest, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(1, self.longest + 1))
        return np.array([self.count], np.float32), {}

    def step(self, action):
        self.count += 1
        self.left -= 1
        return np.array([self.count], np.float32), 1.0, self.left == 0, False, {"steps_so_far": self.count}


def _iterations(trainer: shoal.Trainer, n: int):
    """Each iteration's steps and valid slots (obs, done flags), as the learner saw them."""
    out = []
    for _ in range(n):
        result = trainer.train()
        rollout = trainer.algorithm.buffer.rollout
        steps = rollout[:, :-1].clone()
        out.append((result, steps["obs"][..., 0], steps["valid"], steps["done"]))
    return out


@pytest.mark.parametrize(
    "backend", [dict(), dict(num_workers=2, async_factor=2)], ids=["one group", "two async worker groups"]
)
def test_every_row_ends_at_an_episode_end_and_every_step_is_delivered_once(backend):
    steps_per_iteration = 4 * 16
    with shoal.PPO(
        env=lambda: RandomLengthEnv(),
        horizon=25,  # episodes over 25 steps are cut there: truncations among the terminations
        num_envs=4,
        rollout_fragment_length=16,
        sgd_minibatch_size=32,
        seed=3,
        **backend,
        **COMPLETE,
    ) as trainer:
        iterations = _iterations(trainer, 8)
        episodes = trainer.collector.tracker.episodes_total
    delivered = [[] for _ in range(4)]
    done_steps = 0
    for result, obs, valid, done in iterations:
        assert result["timesteps_this_iter"] >= steps_per_iteration
        assert result["timesteps_this_iter"] == int(valid.sum())  # same-step autoreset: every slot held is a step
        for row in range(4):
            steps = valid[row].nonzero().squeeze(1)
            assert bool(done[row, steps[-1]])  # the row's data ends at an episode end
            assert not done[row, steps[-1] + 1 :].any() and not valid[row, steps[-1] + 1 :].any()
            delivered[row] += obs[row, steps].tolist()
        done_steps += int((done & valid).sum())
    for row in range(4):  # each env's steps, in order, none missing, none twice
        assert delivered[row] == list(range(len(delivered[row]))), row
    assert episodes == done_steps  # each episode counted once, when its last step was delivered


def test_a_turn_based_game_is_cut_where_it_ends_not_where_an_agent_leaves_on_its_own_move():
    from tests.test_aec import TurnsEnv  # a1 leaves on the second move, the game ends on the last

    class Uneven(TurnsEnv):
        """Games of 3 or 6 moves by the env's first reset seed (later resets have none): the short
        env finishes a whole game, its end carried, while it waits for the long one."""

        def reset(self, seed=None, options=None):
            if seed is not None:
                self.max_moves = 3 + 3 * (seed % 2)
            super().reset(seed, options)

    with shoal.PPO(
        env=lambda config: Uneven(death_move=2),
        env_config={"max_episode_steps": 6},  # the most turns a game takes: what complete episodes are sized for
        num_envs=2,
        rollout_fragment_length=7,  # env 0 ends its third game on the 9th move and plays a fourth by env 1's 12th
        sgd_minibatch_size=8,
        seed=0,
        **COMPLETE,
    ) as trainer:
        carried = 0
        for _ in range(5):
            result = trainer.train()
            carried += int(trainer.collector.carry.length.max())
            rollout = trainer.algorithm.buffer.rollout[:, :-1]
            acted = rollout["valid"].view(2, 3, -1).any(1)  # [env, slot]: the env's mover acted
            ends = rollout["env_done"].view(2, 3, -1)
            assert torch.equal(ends.any(1), ends.all(1))  # on every row of the env, or none
            assert result["timesteps_this_iter"] == int(acted.sum())
            assert result["episodes_this_iter"] == int(ends.all(1).sum())  # a game is one episode
            for env, moves in enumerate((3, 6)):
                steps = acted[env].nonzero().squeeze(1)
                assert len(steps) % moves == 0  # whole games only
                assert torch.equal(ends[env].all(0).nonzero().squeeze(1), steps[moves - 1 :: moves])
            # the games repeat slot for slot: a flag left from this rollout would hide one not carried
            trainer.algorithm.buffer.rollout["env_done"].zero_()
    assert carried >= 3


def test_truncations_carried_to_the_next_rollout_bootstrap_from_their_own_last_observation():
    with shoal.PPO(
        env=lambda: RandomLengthEnv(longest=12), horizon=6, num_envs=3, rollout_fragment_length=8, **COMPLETE
    ) as trainer:
        for _ in range(6):
            trainer.train()
            rollout, cut = trainer.algorithm.buffer.rollout, trainer.collector.truncations
            assert rollout["truncated"][cut.row, cut.step].all() and rollout["valid"][cut.row, cut.step].all()
            # the true last observation is one step on from the one the truncated step acted on
            assert torch.equal(cut.obs[:, 0], rollout["obs"][cut.row, cut.step, 0] + 1)
            assert len(cut) == int(rollout["truncated"].sum())  # exactly this rollout's truncations


def test_resume_continues_with_the_carried_steps(tmp_path):
    settings = dict(env=lambda: RandomLengthEnv(), horizon=25, num_envs=2, rollout_fragment_length=16, seed=5)
    settings |= dict(COMPLETE, save_outputs=True, sgd_minibatch_size=32)
    with shoal.PPO(**settings, run_dir=str(tmp_path / "a")) as trainer:
        _iterations(trainer, 3)
        path = trainer.save()
        expected = _iterations(trainer, 2)
    with shoal.Trainer.from_checkpoint(path, env=settings["env"]) as resumed:
        again = _iterations(resumed, 2)
    for (r1, obs1, valid1, _), (r2, obs2, valid2, _) in zip(expected, again):
        assert torch.equal(valid1, valid2) and torch.equal(obs1[valid1], obs2[valid2])  # padding holds leftovers
        assert r1["episode_reward_mean"] == r2["episode_reward_mean"]


def test_an_episode_longer_than_declared_is_reported():
    env = lambda cfg: RandomLengthEnv(longest=200)  # noqa: E731 (declares 10 steps, runs up to 200)
    settings = dict(env_config={"max_episode_steps": 10}, rollout_fragment_length=64)  # room to spare: 64 + 20
    with (
        shoal.PPO(env=env, **settings, **COMPLETE) as trainer,
        pytest.raises(EnvError, match="longer than 10 steps.*horizon=H"),
    ):
        trainer.learn(2_000)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(algo="dqn", env="CartPole-v1"), "replay learner"),
        (dict(algo="sac", env="Pendulum-v1"), "replay learner"),
        (dict(algo="grpo", env="CartPole-v1"), "GRPO"),
        (dict(algo="ppo", env="CartPole-v1", model_config={"core": "lstm"}), "segment learner"),
        (dict(algo="ppo", env="CartPole-v1", advantage_estimator="vtrace"), "segment learner"),
        (dict(algo="ppo", env=lambda: RandomLengthEnv()), "declares no episode limit; set horizon=H"),
        (dict(algo="ppo", env="CartPole-v1", backend="external"), "clients decide"),
    ],
    ids=["dqn", "sac", "grpo", "lstm", "vtrace", "no limit", "external"],
)
def test_combinations_that_make_no_sense_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        shoal.Trainer(**settings, **COMPLETE)


def test_data_parallel_ranks_are_refused():
    with shoal.PPO(env="CartPole-v1", **COMPLETE) as trainer:
        assert "different number of steps" in trainer.algorithm.data_parallel_problem()


@pytest.mark.slow
def test_ppo_learns_cartpole_on_complete_episodes():
    with shoal.PPO(env="CartPole-v1", seed=1, **COMPLETE) as trainer:
        trainer.learn(60_000)
        assert trainer.evaluate(10)["episode_reward_mean"] >= 475


class Reinforce64(Reinforce):
    """REINFORCE with its storage sized by the fragment alone."""

    def __init__(self, config, env):
        super().__init__(config, env)
        self.buffer = RolloutBuffer(env, config.rollout_fragment_length, self.extra_fields())


class DirectReinforce(Reinforce):
    """REINFORCE filling its rollout with collector.collect itself."""

    def training_step(self, collector):
        collector.collect(self.buffer.start_rollout())
        return {}


class Bonus(shoal.Callback):
    def on_postprocess_trajectory(self, trainer, trajectory):
        pass


def test_custom_algorithms_are_told_what_complete_episodes_and_hooks_need():
    with (
        shoal.Trainer(algo=Reinforce64, env="CartPole-v1", **COMPLETE) as trainer,
        pytest.raises(ConfigError, match=r"build its RolloutBuffer with config.rollout_capacity"),
    ):
        trainer.train()
    quiet = dict(save_outputs=False, verbose=0)
    with (
        shoal.Trainer(algo=DirectReinforce, env="CartPole-v1", callbacks=[Bonus()], **quiet) as trainer,
        pytest.warns(UserWarning, match=r"on_postprocess_trajectory callbacks did not apply; collect through self"),
    ):
        trainer.train()
