"""The multiprocessing backend: same data as the serial one, async groups, and faults that never hang."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import shoal
from shoal.vector import MultiprocessBackend, SerialBackend, make_backend
from tests.conftest import CounterEnv

REPO = Path(__file__).resolve().parents[1]


def _gone(pids, timeout=5.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_workers_produce_exactly_what_the_serial_backend_does():
    serial = make_backend("CartPole-v1", 8)
    mp = make_backend("CartPole-v1", 8, num_workers=2)
    serial.reset(3)
    mp.reset(3)
    gen = torch.Generator().manual_seed(0)
    a, b = serial.recv(), mp.recv()
    for _ in range(300):
        assert torch.equal(a.obs, b.obs) and torch.equal(a.reward, b.reward)
        assert torch.equal(a.terminated, b.terminated) and torch.equal(a.truncated, b.truncated)
        actions = torch.randint(0, 2, (8,), generator=gen)
        serial.send(actions)
        mp.send(actions)
        a, b = serial.recv(), mp.recv()
    pids = mp.pids
    mp.close()
    serial.close()
    assert _gone(pids)


class InfoEnv(CounterEnv):
    """Counts steps; at the end of each 3-step episode reports info {"count": t}."""

    def __init__(self):
        super().__init__(limit=3)

    def step(self, action):
        obs, r, te, tr, _ = super().step(action)
        return obs, r, te, tr, ({"count": float(self.t)} if tr else {})


@pytest.mark.slow
def test_async_groups_step_only_their_own_envs_and_carry_infos():
    backend = MultiprocessBackend(lambda i: InfoEnv(), 4, "info", num_workers=2, async_factor=2)
    backend.reset(0)
    first, second = backend.recv(), backend.recv()
    assert {tuple(first.env_id.tolist()), tuple(second.env_id.tolist())} == {(0, 1), (2, 3)}
    backend.send(torch.zeros(2, dtype=torch.long), first)  # only the first group steps
    assert backend.recv() is first
    assert first.obs.flatten().tolist() == [1.0, 1.0] and second.obs.flatten().tolist() == [0.0, 0.0]
    for _ in range(2):
        backend.send(torch.zeros(2, dtype=torch.long))
        batch = backend.recv()
    assert batch is first and first.truncated.all()
    assert backend.final_infos == {r: {"count": 3.0} for r in first.env_id.tolist()}  # rows in the full batch
    assert backend.recv() is first  # nothing is stepping: the last batch received is still current
    backend.close()


class ExplodingEnv(CounterEnv):
    def step(self, action):
        if self.t == 2:
            explode_on_purpose()
        return super().step(action)


def explode_on_purpose():
    raise ValueError("boom at step 2")


@pytest.mark.slow
def test_an_env_exception_comes_back_with_its_traceback_and_env_id():
    backend = MultiprocessBackend(
        lambda i: ExplodingEnv(limit=50) if i == 3 else CounterEnv(limit=50), 4, "bomb", num_workers=2
    )
    pids = backend.pids
    backend.reset(0)
    backend.recv()
    with pytest.raises(shoal.EnvError) as info:
        for _ in range(5):
            backend.send(torch.zeros(4, dtype=torch.long))
            backend.recv()
    message = str(info.value)
    assert "env 3" in message and "boom at step 2" in message and "explode_on_purpose" in message
    assert _gone(pids)
    # the serial backend names the env the same way
    serial = SerialBackend(lambda i: ExplodingEnv(limit=50), 2, "bomb")
    serial.reset(0)
    with pytest.raises(shoal.EnvError, match="env 'bomb' \\(env 0\\) raised ValueError in step\\(\\): boom"):
        for _ in range(5):
            serial.send(torch.zeros(2, dtype=torch.long))


@pytest.mark.slow
def test_a_killed_worker_is_reported_at_once_and_nothing_is_left_behind():
    shm_before = set(os.listdir("/dev/shm"))
    backend = make_backend("CartPole-v1", 4, num_workers=2)
    pids = backend.pids
    backend.reset(0)
    backend.recv()
    os.kill(pids[1], signal.SIGKILL)
    start = time.time()
    with pytest.raises(shoal.EnvError, match="env worker 1 .* died with exit code -9"):
        for _ in range(100):
            backend.send(torch.zeros(4, dtype=torch.long))
            backend.recv()
    assert time.time() - start < 5.0
    assert _gone(pids)
    assert set(os.listdir("/dev/shm")) == shm_before


@pytest.mark.slow
def test_ctrl_c_stops_a_multiprocess_run_cleanly(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "train",
            "CartPole-v1",
            "num_workers=2",
            "verbose=0",
            "total_timesteps=100000000",
            "--run-dir",
            str(run),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not (run / "metrics.jsonl").exists() or not psutil.Process(proc.pid).children():
        assert time.time() < deadline
        time.sleep(0.05)
    workers = [p.pid for p in psutil.Process(proc.pid).children()]
    assert len(workers) == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and '"stop_reason": "SIGINT"' in out
    assert _gone(workers)
    assert (run / "result.json").exists()


class JitteryCounterEnv(CounterEnv):
    """CounterEnv whose steps take a random 0-2 ms, so async groups finish in no fixed order."""

    def __init__(self):
        super().__init__(limit=5)

    def step(self, action):
        time.sleep(self.np_random.uniform(0.0, 0.002))
        return super().step(action)


@pytest.mark.filterwarnings("ignore:num_workers=4 is more")
@pytest.mark.slow
def test_async_rollouts_keep_every_rows_trajectory_whole_in_any_arrival_order():
    algo = shoal.PPO(
        env=JitteryCounterEnv,
        num_envs=8,
        num_workers=4,
        async_factor=4,
        rollout_fragment_length=16,
        sgd_minibatch_size=32,
        save_outputs=False,
        verbose=0,
    )
    arrivals = []
    recv = algo.backend.recv
    algo.backend.recv = lambda: arrivals.append((batch := recv()).rows.start) or batch
    with algo:
        rollout = algo.algorithm.buffer.start_rollout()
        algo.collector.collect(rollout)
        first_last_obs = rollout["obs"][:, -1].clone()
        algo.collector.collect(rollout)
    assert len(arrivals) == 2 * 4 * 16
    in_order = [sorted(arrivals[i : i + 4]) == arrivals[i : i + 4] for i in range(0, len(arrivals), 4)]
    assert not all(in_order)  # the groups really did interleave out of order
    obs, done = rollout["obs"][..., 0], rollout["done"]
    # Within a row, obs counts 0, 1, 2, ... and restarts at 0 exactly after a done step.
    expected_next = torch.where(done[:, :-1], torch.zeros_like(obs[:, 1:]), obs[:, :-1] + 1)
    assert torch.equal(obs[:, 1:], expected_next)
    assert torch.equal(done[:, :-1], obs[:, :-1] == 4)
    # The second rollout starts where the first parked each row.
    assert torch.equal(rollout["obs"][:, 0], first_last_obs)
    assert torch.equal(rollout["reward"][:, :-1], torch.ones(8, 16))


@pytest.mark.parametrize("async_factor", [1, 2])
@pytest.mark.slow
def test_ppo_learns_cartpole_with_worker_processes(async_factor):
    with shoal.PPO(
        env="CartPole-v1", seed=1, num_workers=2, async_factor=async_factor, save_outputs=False, verbose=0
    ) as algo:
        algo.learn(80_000)
        # Async groups arrive in timing-dependent order, so the run is not reproducible. At 40k steps
        # runs on a loaded machine sometimes sat in a dip (110-150); at 60k, runs of seeds 1-8 on a loaded machine
        # all scored 500 (random play scores about 22), but one run with five other processes on the two
        # cores scored 111 there.
        assert algo.evaluate(20)["episode_reward_mean"] >= 150


def test_worker_config_is_checked():
    with pytest.raises(shoal.ConfigError, match="num_envs=8 must be a multiple of num_workers=3.*num_workers=2"):
        shoal.PPO(num_workers=3, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="set one of them"):
        shoal.PPO(num_workers=2, vectorization_mode="vector_entry_point", save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="async_factor=2 needs env worker processes"):
        shoal.PPO(async_factor=2, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="num_workers=2 must be a multiple of async_factor=4.*async_factor=2"):
        shoal.PPO(num_workers=2, async_factor=4, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="'async_factor': 0"):
        shoal.PPO(num_workers=2, async_factor=0, save_outputs=False)
    with pytest.warns(UserWarning, match="more than the"):
        shoal.PPOConfig.build(num_workers=os.cpu_count() * 2, num_envs=os.cpu_count() * 2, sgd_minibatch_size=32)


@pytest.mark.slow
def test_bench_env_prints_throughput_for_each_backend(capsys):
    from shoal.cli import main

    assert main(["bench", "env", "CartPole-v1", "--num-envs", "4", "--seconds", "0.2"]) == 0
    assert (
        main(
            [
                "bench",
                "env",
                "CartPole-v1",
                "--backend",
                "mp",
                "--num-envs",
                "4",
                "--num-workers",
                "2",
                "--async-factor",
                "2",
                "--seconds",
                "0.2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("shoal bench env") == 2 and "serial" in out and "mp" in out
    assert main(["bench", "env", "benchmarks.no_such:Env-v0", "--seconds", "0.1"]) == 2
    assert "cannot import module 'benchmarks.no_such'" in capsys.readouterr().err
