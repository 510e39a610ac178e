"""What the policy server guards against: weak tokens (in Python and from the command line),
clients whose connections fail (one log line, not a traceback each), bugs of its own (logged with
their traceback), and observations outside the policy of docs/serving.md, checked alike in JSON
and in typed arrays, on every route that takes one."""

import json
import logging
import secrets
import socket
import struct
import time

import gymnasium as gym
import numpy as np
import pytest
from test_external_backend import BOX, _backend, _until
from test_serve import _raw

from shoal.cli import main
from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import ConfigError, RequestError
from shoal.serve import PolicyClient, PolicyServer, ServerError, protocol
from shoal.serve.connections import ClientErrorLog

HOW_TO_MAKE_ONE = ("openssl rand -hex 16", 'python -c "import secrets; print(secrets.token_hex(16))"')


@pytest.mark.parametrize(
    "token, problem",
    [
        ("short-token", "is 11 characters"),
        (" " * 16, "only whitespace"),
        ("  a1b2c3d4  \n" + " " * 8, "is 8 characters"),  # whitespace around it does not count
        ("x" * 32, "one character repeated"),
        ("é" * 8 + "a1b2c3d4e5", "printable ASCII"),  # it travels in an HTTP header
    ],
)
def test_weak_tokens_are_refused_saying_how_to_make_one(token, problem):
    with pytest.raises(ConfigError, match=problem) as e:
        PolicyServer(_backend(), port=0, token=token)
    assert all(how in str(e.value) for how in HOW_TO_MAKE_ONE)
    assert not token.strip() or token.strip() not in str(e.value)  # a secret, even a weak one, is not printed


def test_an_exposed_server_needs_a_token_and_a_strong_one_is_accepted():
    with pytest.raises(ConfigError, match="exposes the policy server"):
        PolicyServer(_backend(), host="0.0.0.0", port=0)
    token = secrets.token_hex(16)
    with PolicyServer(_backend(), port=0, token=f" {token}\n") as server:  # as read from a file
        with pytest.raises(ServerError, match="wrong token") as e:
            PolicyClient(server.url, token=secrets.token_hex(16)).info()
        assert e.value.status == 401
        assert PolicyClient(server.url, token=token).info()["auth"] is True


@pytest.mark.timeout(60)  # a token let through would serve (train on padding) until stopped
@pytest.mark.parametrize("given", ["--token", "SHOAL_SERVE_TOKEN"])
@pytest.mark.parametrize("target", ["env", "checkpoint"])
def test_shoal_serve_checks_the_token_before_loading_anything(given, target, tmp_path, monkeypatch, capsys):
    """Both ways of giving a token, to a training server and to a served checkpoint: refused with
    exit 2 before a run directory is made or a checkpoint read (an empty directory is not one)."""
    monkeypatch.chdir(tmp_path)
    args = ["serve", "CartPole-v1" if target == "env" else str(tmp_path), "--port", "0"]
    if target == "env":
        args += ["total_timesteps=64", "num_envs=1", "rollout_fragment_length=32", "--run-dir", "run"]
    if given == "--token":
        args += ["--token", " " * 16]
    else:
        monkeypatch.setenv("SHOAL_SERVE_TOKEN", " " * 16)
    assert main(args) == 2
    assert "only whitespace" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


# ----- client network errors and the server's own faults ------------------------------------
def _reset_mid_request(address):
    """A client that sends half a request and closes with RST (SO_LINGER 0), as a crashed one does."""
    conn = socket.create_connection(address)
    conn.sendall(b"POST /v1/get_action HTTP/1.1\r\nContent-Le")
    time.sleep(0.05)  # the server's thread is reading the headers when the reset comes
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def test_clients_resetting_their_connections_make_one_log_line(capfd, caplog):
    with PolicyServer(_backend(), port=0, max_connections=8) as server:
        for _ in range(6):
            _reset_mid_request(server.address)
        _until(lambda: server._http._slots._value == 8)  # every connection handled and closed
    stderr = capfd.readouterr().err
    lines = [record.getMessage() for record in caplog.records]
    assert "Traceback" not in stderr + caplog.text
    assert len(lines) == 1, lines
    assert "127.0.0.1:" in lines[0] and "ConnectionResetError" in lines[0]


def test_the_client_error_log_says_how_many_lines_it_left_out(caplog):
    log = ClientErrorLog(interval_s=0.3)
    for port in range(5):
        log.report(ConnectionResetError(104, "Connection reset by peer"), ("10.0.0.7", 5000 + port))
    log.report(BrokenPipeError(32, "Broken pipe"), ("10.0.0.8", 6000))  # another kind: a line of its own
    time.sleep(0.35)
    log.report(TimeoutError("timed out"), ("10.0.0.9", 7000))
    log.report(ConnectionResetError(104, "Connection reset by peer"), ("10.0.0.7", 5005))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4 and all(record.levelno == logging.WARNING for record in caplog.records)
    assert "10.0.0.7:5000" in lines[0] and "BrokenPipeError" in lines[1] and "TimeoutError" in lines[2]
    assert "ConnectionResetError" in lines[3] and "4 more" in lines[3]


class Recorder:
    """A session that answers every call at once and keeps the observations the routes gave it."""

    mode = "inference"

    def __init__(self, space):
        self.obs_spec, self.act_spec = obs_spec(space), action_spec(gym.spaces.Discrete(2))
        self.seen = []

    def start_episode(self, episode_id=None):
        return episode_id or "e"

    def get_action(self, episode_id, obs):
        self.seen.append(obs.copy())
        return np.array(0)

    def log_action(self, episode_id, obs, action):
        self.seen.append(obs.copy())

    def log_returns(self, episode_id, reward):
        pass

    def end_episode(self, episode_id, obs, truncated=False):
        self.seen.append(obs.copy())

    def stats(self):
        return {}


def _broken(*args):
    raise RuntimeError("a bug of the session")


def test_a_fault_of_the_server_is_logged_once_with_its_traceback(caplog):
    session = Recorder(BOX)
    session.get_action = session.stats = _broken
    with PolicyServer(session, port=0) as server, PolicyClient(server.url) as client:
        with pytest.raises(ServerError, match="RuntimeError: a bug of the session") as e:
            client.get_action("e", np.zeros(3, np.float32))  # a route's fault: answered 500
        assert e.value.status == 500
        with pytest.raises(ConnectionError):
            PolicyClient(server.url).info()  # a fault outside the routes: the connection drops
        _until(lambda: len(caplog.records) == 2)
    for record in caplog.records:
        assert record.levelno == logging.ERROR and record.exc_info and record.exc_info[0] is RuntimeError
    assert caplog.text.count("Traceback") == 2


# ----- observations ---------------------------------------------------------------------------
IMAGE = gym.spaces.Box(0, 255, (2, 2), np.uint8)
DICT = gym.spaces.Dict({"pos": BOX, "mode": gym.spaces.Discrete(3)})


def _typed(array):
    """``array`` as the binary encoding carries it (the client's own encoder)."""
    return PolicyClient(binary=True)._encode(np.asarray(array))


REFUSED = {
    "bool": (BOX, [True, False, True], r"observation holds true/false; the space .* holds float32 of shape \[3\]"),
    "bool among numbers": (BOX, [True, 0.5, 1], r"observation mixes true/false with numbers"),
    "bool in a Dict": (DICT, {"pos": [True, False, True], "mode": 0}, r"observation\.pos holds true/false"),
    "bool, typed": (BOX, _typed([True, False, True]), r"observation holds true/false"),
    "bool for ints, typed": (IMAGE, _typed(np.ones((2, 2), bool)), r"holds true/false; .* uint8 of shape \[2, 2\]"),
    "above high": (BOX, [0.5, 1.5, 0.0], r"observation\[1\] is 1\.5, outside \[-1\.0, 1\.0\]"),
    "below low": (BOX, [-1.001, 0, 0], r"observation\[0\] is -1\.001, outside \[-1\.0, 1\.0\]"),
    "above high, ints": (IMAGE, [[0, 256], [0, 0]], r"observation\[0, 1\] is 256, outside \[0, 255\]"),
    "below low, typed": (IMAGE, _typed(np.array([[0, 0], [-1, 0]], np.int16)), r"observation\[1, 0\] is -1"),
    "Discrete": (gym.spaces.Discrete(3), 3, r"observation is 3, outside \[0, 2\]"),
    "MultiDiscrete": (gym.spaces.MultiDiscrete([3, 4]), [2, 4], r"observation\[1\] is 4, outside \[0, 3\]"),
    "MultiBinary": (gym.spaces.MultiBinary(3), [0, 1, 2], r"observation\[2\] is 2, outside \[0, 1\]"),
    "NaN, typed": (BOX, _typed(np.array([0, np.nan, 0], np.float32)), r"not finite"),
    "infinity, typed": (BOX, _typed(np.array([0, 0, -np.inf])), r"not finite"),
    "beyond float32": (BOX, [1e39, 0, 0], r"not finite float32"),
    "NaN for ints, typed": (IMAGE, _typed(np.full((2, 2), np.nan)), r"not finite"),
    "shape": (BOX, [[0.1, 0.2, 0.3]], r"observation has shape \[1, 3\]; the space .* needs \[3\]"),
    "shape, typed": (BOX, _typed(np.zeros(4, np.float32)), r"observation has shape \[4\]; the space .* needs \[3\]"),
    "fraction for ints": (
        IMAGE,
        [[0, 0.5], [0, 0]],
        r"observation holds floats that are not whole numbers \(0\.5\); .* uint8",
    ),
    "fraction for ints, typed": (
        IMAGE,
        _typed(np.full((2, 2), 2.5, np.float32)),
        r"holds floats that are not whole numbers \(2\.5\)",
    ),
    "fraction for Discrete": (
        gym.spaces.Discrete(3),
        1.5,
        r"observation holds floats that are not whole numbers \(1\.5\)",
    ),
}

ACCEPTED = {
    "in range": (BOX, [0.25, -0.5, 0.75], [0.25, -0.5, 0.75]),
    "ints for floats, on the bounds": (BOX, [-1, 0, 1], [-1.0, 0.0, 1.0]),
    "float64 for float32, typed": (BOX, _typed(np.array([0.1, 0.2, -1.0])), np.float32([0.1, 0.2, -1.0])),
    "whole floats for ints": (IMAGE, [[0.0, 255.0], [1, 2]], [[0, 255], [1, 2]]),
    "whole floats for ints, typed": (IMAGE, _typed(np.float32([[0, 255], [1, 2]])), [[0, 255], [1, 2]]),
    "uint8, typed": (IMAGE, _typed(np.uint8([[0, 255], [1, 2]])), [[0, 255], [1, 2]]),
    "whole float for Discrete": (gym.spaces.Discrete(3), 2.0, 2),
    "MultiBinary": (gym.spaces.MultiBinary(3), [0, 1, 1], [0, 1, 1]),
    "Dict": (DICT, {"pos": [0, 0.5, 1], "mode": 2}, {"pos": [0, 0.5, 1], "mode": 2}),
}


def _read(value, space):
    spec = obs_spec(space)
    return protocol.observation(value, spec, np.empty(spec.shape, spec.dtype))


@pytest.mark.parametrize("space, value, message", REFUSED.values(), ids=REFUSED.keys())
def test_observations_outside_the_policy_are_400s_saying_why(space, value, message):
    with pytest.raises(RequestError, match=message) as e:
        _read(value, space)
    assert e.value.status == 400


@pytest.mark.parametrize("space, value, expected", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_observations_inside_the_policy_are_read_exactly(space, value, expected):
    stored = _read(value, space)
    if isinstance(space, gym.spaces.Dict):
        expected = {"pos": np.float32(expected["pos"]), "mode": expected["mode"]}
    if obs_spec(space).structured:
        expected = gym.spaces.flatten(space, expected)
    assert np.array_equal(stored, np.asarray(expected, stored.dtype))


CARTPOLE = gym.make("CartPole-v1").observation_space


@pytest.mark.parametrize("space", [BOX, CARTPOLE, IMAGE, gym.spaces.MultiDiscrete([3, 4], start=[-1, 2])])
def test_in_the_space_means_what_gymnasiums_contains_says(space):
    """The bounds are Gymnasium's: a value is accepted exactly when ``space.contains`` holds for it
    in the space's dtype. Each element is a bound, just past one, or anything in between."""
    low, high = (
        (space.low, space.high) if isinstance(space, gym.spaces.Box) else (space.start, space.start + space.nvec - 1)
    )
    low, high = np.maximum(low, -10.0), np.minimum(high, 10.0)  # CartPole's velocities: any float32
    step = 1 if np.dtype(space.dtype).kind in "iu" else 1e-3
    choices = np.stack([low, high, low - step, high + step, (low + high) / 2])
    rng = np.random.default_rng(0)
    for _ in range(200):
        pick = rng.integers(0, len(choices), space.shape)
        value = np.take_along_axis(choices, pick[None], 0)[0].astype(space.dtype if step == 1 else np.float64)
        try:
            _read(value.tolist(), space)
            accepted = True
        except RequestError:
            accepted = False
        assert accepted == space.contains(value.astype(space.dtype)), value


def test_logged_actions_follow_the_same_rules():
    discrete, box = action_spec(gym.spaces.Discrete(2)), action_spec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert protocol.action(1.0, discrete).tolist() == 1 and protocol.action([1, -0.5], box).tolist() == [1.0, -0.5]
    for value, spec, message in [
        (True, discrete, "action holds true/false"),
        (0.5, discrete, "action holds floats that are not whole numbers"),
        (2, discrete, r"action is 2, outside \[0, 1\]"),
        ([0.0, 1.5], box, r"action\[1\] is 1\.5, outside"),
    ]:
        with pytest.raises(RequestError, match=message):
            protocol.action(value, spec)


def test_only_a_body_that_writes_true_or_false_is_searched_for_bools():
    """Looking at every number of an observation for a bool took as long as reading them (an
    84x84x4 one: 5 ms more); JSON writes a bool only as true or false, so a body without either
    word is not searched. In any encoding JSON allows, a body with one is."""
    numbers = {"episode_id": "e", "observation": [0.5, 1, 0]}
    assert protocol.parse_body(json.dumps(numbers).encode()) == (numbers, False)
    spec = obs_spec(BOX)
    for body in [numbers | {"truncated": True}, numbers | {"observation": [True, 0.5, 1]}]:
        for encoding in ["utf-8", "utf-8-sig", "utf-16", "utf-32-le"]:
            data, bools = protocol.parse_body(json.dumps(body).encode(encoding))
            assert data == body and bools, encoding
    with pytest.raises(RequestError, match="mixes true/false with numbers"):
        protocol.observation(data["observation"], spec, np.empty(spec.shape, spec.dtype), bools)


@pytest.mark.parametrize("route", ["get_action", "log_action", "end_episode"])
def test_every_route_taking_an_observation_applies_the_policy(route):
    session = Recorder(BOX)
    sent = {
        "bool": ([True, False, True], 400),
        "bool among numbers": ([True, 0.5, 1], 400),
        "out of range": ([0.0, 0.0, 2.0], 400),
        "bool, typed": (_typed([True, False, True]), 400),
        "fraction out of range, typed": (_typed(np.array([0.5, -3.5, 0.0])), 400),
        "in range": ([0.5, -1, 1], 200),
        "in range, typed": (_typed(np.float32([0.5, -1, 1])), 200),
    }
    with PolicyServer(session, port=0) as server:
        for what, (observation, status) in sent.items():
            body = {"episode_id": "e", "observation": observation, "action": 0}
            got, reply = _raw(server.url, "POST", f"/v1/{route}", json.dumps(body).encode())
            assert got == status, (what, reply)
    assert [obs.tolist() for obs in session.seen] == [[0.5, -1.0, 1.0]] * 2
