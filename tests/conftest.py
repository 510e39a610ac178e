"""Small envs with known dynamics for the env-layer and learning tests; the hypothesis profiles."""

# torch, shoal and hypothesis are imported where they are used, not at the top: pytest-xdist's
# controller process loads this file too, before it starts the workers, and never runs a test.
from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import pytest

if TYPE_CHECKING:
    import torch

    from shoal.models.policy import ActorCriticPolicy


# Property tests (tests/test_properties_*.py) run under one of two profiles:
# - "ci" (chosen when CI is set): derandomize=True, so every run tries the same examples and a red
#   build is always caused by the change under test, never by a new random draw finding an old bug;
#   no example database, since a CI checkout starts empty. print_blob=True prints
#   @reproduce_failure for any failure, to replay it locally.
# - "dev" (the default): random draws, so every local run explores new examples, and hypothesis's
#   database in .hypothesis/ replays the last failure first.
# HYPOTHESIS_PROFILE=ci gives a local run exactly CI's examples.
@pytest.hookimpl(tryfirst=True)  # before hypothesis's own plugin, whose --hypothesis-* options go on top
def pytest_configure(config):
    """In each process that runs tests (not in the controller of a pytest-xdist run, which only
    hands the tests out): the garbage collector off while the test modules are imported (see
    pytest_collection_finish), and the hypothesis profile, loaded before those imports (a
    settings() made at import takes the profile's values)."""
    if config.getoption("numprocesses", default=None) and not hasattr(config, "workerinput"):
        return
    gc.disable()
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("dev", print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(items):
    """The modules with long tests first, each module's tests kept together and in their order:
    those with slow tests (each trains, or starts processes, for up to a minute), then those with
    property tests (each runs its many examples for up to a few seconds). At the end of the run,
    one of them would keep a pytest-xdist worker busy while the other had nothing left to do; kept
    together, a module's fixtures are made once."""
    from hypothesis import is_hypothesis_test

    def module(item):
        return getattr(item, "module", None)

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    properties = {module(item) for item in items if is_hypothesis_test(getattr(item, "obj", None))}
    items.sort(key=lambda item: (module(item) not in slow, module(item) not in properties))


def pytest_collection_finish(session):
    """Importing the test modules (torch, shoal and the rest with them) builds a heap of about a
    million objects that live until the end. With the garbage collector on, each of its full
    searches goes through all of them: a dozen and more while the modules are imported, a few
    tenths of a second each, and more during the tests. So it is off during the imports
    (pytest_configure); then one search frees the imports' garbage, and what is left is frozen out
    of later searches before the tests run. Objects the tests make are collected as usual."""
    gc.collect()
    gc.freeze()
    gc.enable()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The session is over. On its way out Python would search the whole heap for garbage, more
    than once: over a million objects in a process that ran many of the tests (torch's and every
    test module's among them), seconds that each pytest-xdist worker spends after its last test
    while the run waits for it. Freezing the heap skips those searches; live objects are still
    released as the modules are torn down, and garbage in cycles is left to the exit (child
    processes are still ended by multiprocessing's own exit handler)."""
    gc.freeze()


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance (2 CPUs) for every test that needs Ray. Test modules whose classes
    the actors unpickle register themselves with ``ray.cloudpickle.register_pickle_by_value``:
    the actors cannot import test files."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def no_flush_denormal():
    """Every Trainer turns on flush-to-zero for the whole process (``torch.set_flush_denormal``),
    and it stays on after the trainer is gone. Hypothesis cannot draw floats then (subnormals read
    as 0), so a property test starts without it."""
    import torch

    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


# The short multi-agent learning runs: 8 envs x 20 steps a rollout, 2 minibatches, 4 epochs.
SHORT_TEAM_RUN = dict(
    num_envs=8, rollout_fragment_length=20, sgd_minibatch_size=80, num_sgd_iter=4, save_outputs=False, verbose=0, seed=0
)


class CounterEnv(gym.Env):
    """obs = [step count]; reward 1 per step; truncates after `limit` steps, or terminates if `terminate`."""

    def __init__(self, limit: int = 5, terminate: bool = False, obs_shape=(1,), reward=1.0):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.limit, self.terminate, self.obs_shape, self.reward = limit, terminate, obs_shape, reward
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.obs_shape, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.limit
        obs = np.full(self.obs_shape, self.t, np.float32)
        return obs, self.reward, done and self.terminate, done and not self.terminate, {}


class TargetEnv(gym.Env):
    """One-step continuous task: reward = -(action - target)^2 with target = obs in [-1, 1]."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1, 1, size=(1,)).astype(np.float32)
        return self.target, {}

    def step(self, action):
        reward = -float(np.square(action - self.target).sum())
        return self.target, reward, True, False, {}


@pytest.fixture
def counter_env():
    return CounterEnv


def mlp_policy(
    obs_dim: int,
    space: gym.Space,
    hiddens=(7, 6),
    log_std_init: float = 0.0,
    critic_dim: int = 0,
    activation: str = "tanh",
) -> ActorCriticPolicy:
    """The built-in actor-critic over ``obs_dim`` floats and the action ``space``."""
    from shoal.envs.spaces import action_spec
    from shoal.models.distributions import make_distribution
    from shoal.models.networks import MLPModel
    from shoal.models.policy import ActorCriticPolicy

    spec = action_spec(space)
    model = MLPModel(obs_dim, make_distribution(spec).param_dim, list(hiddens), activation, critic_dim)
    return ActorCriticPolicy(model, spec, log_std_init=log_std_init)


def folded_decisions(row, reward, value, terminated, truncated, final_value, valid):
    """The reference loops' reading of one row with non-decision steps (``valid`` False): each
    decision d as ``(d, folded reward, bootstrap value, cut)``, its reward plus those of the
    non-decision steps after it up to the next decision, a done or the rollout's end (added
    undiscounted), the value that follows (0 after a termination, the final value after a
    truncation, the next decision's, or the tail value at the end) and whether the recursion is
    cut after it."""
    t = reward.shape[1]
    for d in np.flatnonzero(valid[row]):
        total, s = reward[row, d], d
        while not (terminated[row, s] or truncated[row, s]) and s + 1 < t and not valid[row, s + 1]:
            s += 1
            total += reward[row, s]
        if terminated[row, s]:
            yield d, total, 0.0, True
        elif truncated[row, s]:
            yield d, total, final_value[row, s], True
        elif s + 1 < t:  # s + 1 is the next decision
            yield d, total, value[row, s + 1], False
        else:  # no later decision: the tail value, and the recursion ends
            yield d, total, value[row, t], True


def weights_of(module: torch.nn.Module) -> torch.Tensor:
    """Every parameter of ``module`` as one flat tensor."""
    import torch

    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def assert_resume_is_bit_identical(preset, settings, tmp_path, keys, iterations=4, split=2, **reload):
    """``iterations`` training iterations in one go, and ``split`` of them, a checkpoint, a fresh
    trainer from it (``from_checkpoint(path, **reload)``) and the rest: the policy's weights and
    the last result's ``keys`` must be identical."""
    import torch

    straight = preset(run_dir=str(tmp_path / "straight"), **settings)
    for _ in range(iterations):
        last_straight = straight.train()
    first = preset(run_dir=str(tmp_path / "split"), **settings)
    for _ in range(split):
        first.train()
    path = first.save()
    first.close()
    resumed = preset.from_checkpoint(path, **reload)
    for _ in range(iterations - split):
        last_resumed = resumed.train()
    assert torch.equal(weights_of(resumed.get_policy()), weights_of(straight.get_policy()))
    for key in keys:
        assert last_resumed[key] == last_straight[key], key


def build_ppo(config, env, dtype: torch.dtype | None = None):
    """What ``algo=ppo`` builds for ``config`` on ``env`` (PPO, or its segment learner), its
    networks in ``dtype`` (None: float32) from torch seed 0; ``algo.learn(algo.learners[
    "default_policy"], rollout, None)`` runs one update."""
    import torch

    from shoal.algos.ppo import PPOAlgorithm

    dtype = torch.float32 if dtype is None else dtype
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return PPOAlgorithm.implementation(config)(config, env)
    finally:
        torch.set_default_dtype(previous)


def play_randomly(env, episodes: int, seed: int = 0) -> None:
    """Play ``episodes`` whole episodes of uniformly random Discrete actions (e.g. through Minari's
    DataCollector), episode k reset with seed k."""
    rng = np.random.default_rng(seed)
    for k in range(episodes):
        env.reset(seed=k)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            done = terminated or truncated
