"""The policy server over HTTP: its limits, training from served episodes (on- and
off-policy, one or two slot groups), a hostile client beside well-behaved ones, a served
checkpoint acting as ``compute_actions`` does, and the docs' curl session. (The backend's steps:
tests/test_external_backend.py; tokens, failing connections and the observation rules:
tests/test_serve_guards.py.)"""

import contextlib
import http.client
import itertools
import json
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_external_backend import _backend, _until

import shoal
from examples.external_cartpole import simulate
from shoal.errors import ConfigError, EnvError
from shoal.serve import PolicyClient, PolicyServer, ServerError, checkpoint_server, serve_training
from shoal.vector.external import ExternalBackend

ROOT = Path(__file__).resolve().parents[1]
DOCS_URL = "http://127.0.0.1:9900"
CURL_SESSION = [line for line in (ROOT / "docs" / "serving.md").read_text().splitlines() if line.startswith("curl -s")]


def _raw(url, method, path, body=b"", headers=None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body, headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


HOSTILE = [
    ("POST", "/v1/get_action", b"{not json", 400),
    ("POST", "/v1/get_action", b"[1, 2]", 400),
    ("POST", "/v1/get_action", b'{"episode_id": "nope", "observation": [0, 0, 0, 0]}', 404),
    ("POST", "/v1/get_action", b'{"episode_id": 7, "observation": [0, 0, 0, 0]}', 400),
    ("POST", "/v1/log_returns", b'{"episode_id": "nope", "reward": NaN}', 400),
    ("POST", "/v1/end_episode", b'{"episode_id": "nope"}', 400),  # no observation
    ("POST", "/v1/end_episode", b'{"episode_id": "nope", "observation": [0, 0, 0, 0]}', 404),
    ("POST", "/v1/start_episode", b'{"episode_id": "../../etc"}', 400),
    (
        "POST",
        "/v1/get_action",
        b'{"episode_id": "x", "observation": {"dtype": "float32", "shape": [1e999], "data": ""}}',
        400,
    ),
    ("POST", "/v1/teleport", b"{}", 404),
    ("POST", "/v2/get_action", b"{}", 404),
    ("GET", "/etc/passwd", b"", 404),
    ("POST", "/v1/get_action", b"[" * 100_000 + b"]" * 100_000, 400),
    ("POST", "/v1/get_action", b"{}", 413),  # claims a body larger than the server takes
]


@pytest.mark.slow
def test_served_episodes_train_ppo_while_a_hostile_client_is_refused():
    """Two simulators drive CartPole through the server and PPO learns from them; meanwhile a
    hostile client sends malformed, oversized and out-of-order requests and starts episodes it
    abandons. Each is refused with a 4xx, and every episode the good clients end arrives."""
    ended: list[float] = []  # returns of the episodes the good clients ended
    seen: list[float] = []  # returns of the episodes training saw
    stop, refused, errors, vanished = threading.Event(), [], [], []

    class Seen(shoal.Callback):
        def on_episode_end(self, trainer, episode):
            seen.append(round(episode.episode_reward, 3))

    def good(server, seed):
        env = gym.make("CartPole-v1")
        with PolicyClient(server.url) as client:
            for n in range(10_000):
                obs, _ = env.reset(seed=seed + n)
                try:
                    eid, total = client.start_episode(), 0.0
                    while True:
                        obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
                        reward += 1e-3 * (seed + n)  # tells the episodes apart
                        client.log_returns(eid, reward)
                        total += reward
                        if terminated or truncated:
                            break
                    client.end_episode(eid, obs, truncated=truncated and not terminated)
                    ended.append(round(total, 3))
                except (ServerError, ConnectionError) as e:
                    if "shutting down" not in str(e):  # the end of training
                        errors.append(repr(e))
                        server.session.close()  # ends the run now: the failure is reported, not a stalled run
                    return

    def hostile(url):
        with contextlib.suppress(OSError, ServerError):  # the server closed at the end of training
            attack(url)

    def attack(url):
        for rounds in itertools.count():
            if stop.is_set():
                return
            for method, path, body, status in HOSTILE:
                size = 1 << 30 if status == 413 else len(body)
                got, reply = _raw(url, method, path, body, {"Content-Length": str(size)})
                refused.append((path, got == status, reply.get("error", "")[:80]))
            # now and then (each holds a slot, or its group, for client_timeout_s): an episode
            # started and abandoned after a bad request, and one that vanishes owing a step's result
            with PolicyClient(url) as client:
                if rounds % 100 == 50:
                    eid = client.start_episode(wait_s=10)
                    try:
                        client.get_action(eid, [0.0, 0.0, 0.0])
                    except ServerError as e:
                        refused.append(("start+get", e.status == 400, str(e)[:80]))
                if rounds % 100 == 0:
                    eid = client.start_episode(wait_s=10)
                    client.get_action(eid, [0.0, 0.0, 0.0, 0.0])
                    vanished.append(eid)
            time.sleep(0.02)

    def start(server):
        for i, fn in enumerate([good, good]):
            threading.Thread(target=fn, args=(server, 1000 * (i + 1)), daemon=True).start()
        threading.Thread(target=hostile, args=(server.url,), daemon=True).start()

    settings = dict(
        env="CartPole-v1",
        num_envs=3,
        seed=0,
        total_timesteps=8_000,
        save_outputs=False,
        verbose=0,
        client_timeout_s=2.0,  # a good client slowed down by a loaded machine is not given up on
        callbacks=[Seen()],
    )
    try:
        _, result = serve_training(settings, on_ready=start, port=0)
    finally:
        stop.set()
        assert not errors, errors
    assert refused and all(ok for _, ok, _ in refused), [r for r in refused if not r[1]][:5]
    assert {path for path, _, _ in refused} >= {"/v1/get_action", "/v1/teleport", "start+get"}
    # every episode training saw is one a good client ended; at most one per slot was still unreported
    served = [r for r in seen if r > 0]  # the vanished episodes end truncated with nothing earned
    assert vanished and len(seen) - len(served) >= len(vanished) - 1  # the last may be cut off by the end
    assert not set(served) - set(ended) and 0 <= len(ended) - len(served) <= 3
    assert result["episode_reward_mean"] > 60  # random play: about 22


@pytest.mark.slow
def test_logged_actions_reach_dqn_replay():
    """A replay learner learns from actions the clients chose themselves: the buffer holds them."""

    def client_loop(url, stop):
        env = gym.make("CartPole-v1")
        with PolicyClient(url) as client:
            while not stop.is_set():
                obs, _ = env.reset(seed=1)
                try:
                    eid, done = client.start_episode(), False
                    while not done:
                        action = int(obs[0] > 0)  # the client's own rule: push toward the centre
                        client.log_action(eid, obs, action)
                        obs, reward, terminated, truncated, _ = env.step(action)
                        client.log_returns(eid, reward)
                        done = terminated or truncated
                    client.end_episode(eid, obs, truncated=truncated and not terminated)
                except (ServerError, ConnectionError):
                    return

    stop = threading.Event()
    settings = dict(env="CartPole-v1", algo="dqn", num_envs=1, total_timesteps=600, learning_starts=100)
    trainer, _ = _train_with_client(settings, client_loop, stop)
    stop.set()
    replay = trainer.algorithm.replay
    taken = replay.sampleable  # [1 row, columns]: the stored steps that are transitions
    assert int(taken.sum()) > 400
    obs, action = replay.storage["obs"][taken], replay.storage["action"][taken]
    assert torch.equal(action, (obs[:, 0] > 0).long())


def test_a_served_checkpoint_acts_as_compute_actions(tmp_path):
    with shoal.PPO(
        env="CartPole-v1",
        seed=3,
        run_dir=str(tmp_path / "run"),
        verbose=0,
        total_timesteps=512,
        num_envs=2,
        rollout_fragment_length=256,
    ) as algo:
        algo.learn()
        checkpoint = algo.save()
    obs = _cartpole_observations(np.random.default_rng(0), 40)
    expected = algo.compute_actions(obs, deterministic=True)
    with checkpoint_server(checkpoint, port=0, max_wait_ms=5) as server:
        replies: dict[int, int] = {}

        def ask(rows):
            with PolicyClient(server.url) as client:
                eid = client.start_episode()
                for i in rows:
                    replies[i] = client.get_action(eid, obs[i])

        threads = [threading.Thread(target=ask, args=(range(k, 40, 4),)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        info = PolicyClient(server.url).info()
        # the docs' curl session is a second client, in no language at all
        for line in CURL_SESSION:
            reply = json.loads(
                subprocess.run(
                    shlex.split(line.replace(DOCS_URL, server.url)), capture_output=True, check=True, timeout=30
                ).stdout
            )
            assert "error" not in reply, (line, reply)
            if "get_action" in line:
                assert reply["action"] in (0, 1)
    assert [replies[i] for i in range(40)] == expected.tolist()
    assert info["mode"] == "inference" and info["observation_space"]["shape"] == [4]
    assert sum(int(size) * n for size, n in info["stats"]["batch_sizes"].items()) == 40


SPACES_MODULE = """
import gymnasium as gym
import numpy as np


class Spaces(gym.Env):
    observation_space = gym.spaces.Box(-5.0, 5.0, (6,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


gym.register("MySim-v0", entry_point=Spaces)
"""


def test_a_simulator_with_only_spaces_is_served_by_its_registered_id(tmp_path, monkeypatch):
    """The docs' recipe: a class declaring the spaces, registered as a Gymnasium id in the user's
    module; training and serving its checkpoint read the spaces and never step it."""
    (tmp_path / "mysim_spaces.py").write_text(SPACES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = dict(env="mysim_spaces:MySim-v0", backend="external", num_envs=4, async_factor=2, sgd_minibatch_size=64)
    with shoal.Trainer(**settings, run_dir=str(tmp_path / "run"), verbose=0) as algo:
        backend = algo.backend
        assert isinstance(backend, ExternalBackend) and backend.num_envs == 4 and backend.async_factor == 2
        assert backend.obs_spec.shape == (6,) and backend.act_spec.shape == (2,)
        checkpoint = algo.save()
    with checkpoint_server(checkpoint, port=0) as server, PolicyClient(server.url) as client:
        action = client.get_action(client.start_episode(), [0.0] * 6)
        assert action.shape == (2,) and (abs(action) <= 1).all()
    with pytest.raises(ConfigError, match="leave num_workers=0"):
        shoal.PPOConfig.build(env="CartPole-v1", backend="external", num_workers=2)
    with pytest.raises(ConfigError, match="a multiple of async_factor=3"):
        shoal.PPOConfig.build(env="CartPole-v1", backend="external", num_envs=4, async_factor=3)
    running = _backend()
    running.start_episode()
    with pytest.raises(EnvError, match="restarts its envs each iteration \\(GRPO\\)"):
        running.reset()


def test_shoal_train_points_served_runs_to_shoal_serve(capsys):
    from shoal.cli import main

    assert main(["train", "CartPole-v1", "backend=external"]) == 2
    assert "shoal serve" in capsys.readouterr().err


@pytest.mark.slow
def test_rate_connection_size_and_time_limits():
    backend = _backend()
    limits = dict(max_requests_per_s=5, max_connections=2, max_body_bytes=64, idle_timeout_s=2.0)
    with PolicyServer(backend, port=0, **limits) as server:
        statuses = []
        with PolicyClient(server.url, rate_retries=0) as client:
            for _ in range(8):  # a burst of one second's worth, then refused
                try:
                    client.start_episode(wait_s=0)
                    statuses.append(200)
                except ServerError as e:
                    statuses.append(e.status)
                    assert e.retry_after_s == 1
        assert statuses[:2] == [200, 200] and 429 in statuses  # (503 once both slots hold an episode)
        # a third connection is answered 503 at once, before it sends anything (no thread for it);
        # the idle timeout is long enough that a loaded machine cannot reap the two held ones first.
        # The burst's connections must have given their slots back first: else a held one is refused
        # and the third, taking a slot freed meanwhile, waits for a request instead
        _until(lambda: server._http._slots._value == 2)
        held = [socket.create_connection(server.address) for _ in range(2)]
        time.sleep(0.1)
        with socket.create_connection(server.address, timeout=5) as third:
            assert b"503" in third.recv(4096).split(b"\r\n")[0]
        with pytest.raises(ServerError, match="too many open connections") as e:  # a client that sends first
            PolicyClient(server.url).info()
        assert e.value.status == 503 and e.value.retry_after_s == 1
        # connections idle, or trickling a request, are closed after idle_timeout_s
        held[0].sendall(b"POST /v1/start_episode HTTP/1.1\r\n")
        started = time.monotonic()
        for conn in held:
            conn.settimeout(10)
            assert conn.recv(4096) == b""
            conn.close()
        assert time.monotonic() - started < 2.0 + 1.5  # the timeout and one reaper interval, with slack
        body = json.dumps({"episode_id": "x" * 100}).encode()

        def refused_for_size():
            status, reply = _raw(server.url, "POST", "/v1/start_episode", body, {"Content-Length": str(len(body))})
            return status == 413 and "at most 64" in reply["error"]

        _until(refused_for_size)  # once the closed connections are counted out


@pytest.mark.slow
def test_the_client_waits_out_the_rate_limit_and_sends_the_request_again():
    with PolicyServer(_backend(), port=0, max_requests_per_s=5) as server, PolicyClient(server.url) as client:
        started = time.monotonic()
        answers = [client.info() for _ in range(7)]  # 5 at once, then a 429 and a wait
        assert time.monotonic() - started >= 1.0
        assert answers[-1]["protocol"] == 1 and answers[-1]["stats"]["refused"] == {"429": 1}


@pytest.mark.slow
def test_two_groups_with_one_client_do_not_hold_up_the_rollout():
    """async_factor=2 and a single client (the example's simulator): the group without an episode
    steps as padding."""
    settings = dict(env="CartPole-v1", num_envs=4, async_factor=2, sgd_minibatch_size=64, total_timesteps=512)
    trainer, result = _train_with_client(settings, simulate)
    assert trainer.timesteps_total >= 512 and result["episodes_total"] > 0


def test_a_served_recurrent_checkpoint_keeps_each_episodes_state(tmp_path):
    """Two episodes at once from an LSTM policy: each gets the actions compute_actions gives when
    the state of that episode alone is carried from step to step."""
    lstm = dict(core="lstm", core_size=16, hiddens=[], head_hiddens=[16])
    with shoal.PPO(env="CartPole-v1", model_config=lstm, seed=5, run_dir=str(tmp_path / "run"), verbose=0) as algo:
        checkpoint = algo.save()
    rng = np.random.default_rng(1)
    episodes = [_cartpole_observations(rng, 12) for _ in range(2)]
    expected = []
    for obs in episodes:
        state, actions = algo.initial_state(1), []
        for o in obs:
            action, state = algo.compute_actions(o[None], state, deterministic=True)
            actions.append(int(action[0]))
        expected.append(actions)
    served: list[list[int]] = [[], []]
    with checkpoint_server(checkpoint, port=0, max_wait_ms=5) as server:

        def play(k):
            with PolicyClient(server.url) as client:
                eid = client.start_episode()
                served[k] = [client.get_action(eid, o) for o in episodes[k]]

        threads = [threading.Thread(target=play, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert served == expected
    # the state matters: acting from the initial state at every step gives other actions
    stateless = [algo.compute_actions(obs, deterministic=True).tolist() for obs in episodes]
    assert stateless != expected


def _cartpole_observations(rng, n):
    """``n`` random observations within CartPole's bounds (the server refuses any outside them)."""
    space = gym.make("CartPole-v1").observation_space
    return np.clip(rng.normal(size=(n, *space.shape)), space.low, space.high).astype(np.float32)


def _train_with_client(settings, client, *args):
    """``serve_training`` of ``settings`` (quiet, untuned, no outputs), with ``client(url, *args)``
    started in a thread once the server is up."""

    def start(server):
        threading.Thread(target=client, args=(server.url, *args), daemon=True).start()

    return serve_training({"save_outputs": False, "verbose": 0, "tuned": False, **settings}, on_ready=start, port=0)
