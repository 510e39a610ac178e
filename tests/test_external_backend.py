"""The external-env backend behind the policy server: its steps (next-step autoreset, padding,
rewards and done flags), calls out of order, silent and vanished clients, slot reuse, logged
actions, and the protocol's checks of observations against the spaces."""

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.envs.spaces import action_spec, obs_spec
from shoal.errors import RequestError
from shoal.serve import PolicyClient, protocol
from shoal.vector.external import ExternalBackend

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def _backend(num_envs=2, timeout=60.0, async_factor=1):
    return ExternalBackend("sim", num_envs, obs_spec(BOX), action_spec(gym.spaces.Discrete(2)), async_factor, timeout)


def _in_thread(fn, *args):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn(*args)), daemon=True)
    thread.start()
    return thread, out


def _step(backend, action=1):
    batch = backend.recv()
    backend.send(torch.full((backend.num_envs,), action), batch)
    return batch


def test_backend_steps_are_next_step_transitions():
    """A slot's first observation follows a padding step (not a transition), rewards go to the
    action before them, and an episode's end returns its final observation with the done flag."""
    backend = _backend(num_envs=2)
    backend.reset()
    batch = _step(backend)  # fresh: every slot is padding
    assert not batch.valid.any()
    a = backend.start_episode("a")
    obs0 = np.full(3, 0.5, np.float32)
    thread, out = _in_thread(backend.get_action, a, obs0)
    batch = _step(backend, action=1)  # slot 0 posted its first observation: it is answered
    thread.join(5)
    assert out["value"] == 1
    assert batch.obs[0].tolist() == [0.5] * 3 and not batch.valid[0]  # the step before it was padding
    backend.log_returns(a, 2.0)
    backend.log_returns(a, 0.5)
    backend.end_episode(a, np.full(3, -0.25, np.float32), truncated=True)
    batch = backend.recv()
    assert batch.valid[0] and batch.reward[0] == 2.5 and batch.truncated[0] and not batch.terminated[0]
    assert batch.obs[0].tolist() == [-0.25] * 3  # next-step autoreset: the final observation
    assert not batch.valid[1] and batch.obs[1].tolist() == [0.0] * 3  # a slot without an episode is padding
    backend.send(torch.zeros(2, dtype=torch.long), batch)
    assert backend.stats()["batch_sizes"] == {1: 1}
    with pytest.raises(RequestError, match="is closed: it ended") as e:
        backend.log_returns(a, 1.0)
    assert e.value.status == 404


def test_backend_refuses_calls_out_of_order_and_closes_silent_clients():
    backend = _backend(num_envs=1, timeout=0.2)
    backend.reset()
    _step(backend)
    a = backend.start_episode()
    with pytest.raises(RequestError, match="before its first action") as e:
        backend.log_returns(a, 1.0)
    assert e.value.status == 409
    with pytest.raises(RequestError, match="all 1 slots") as e:
        backend.start_episode()
    assert e.value.status == 503 and e.value.retry_after_s
    with pytest.raises(RequestError, match="already running"):
        backend.start_episode(a)
    with pytest.raises(RequestError, match="learns only from actions it chose"):
        backend.log_action(a, np.zeros(3, np.float32), np.int64(0))
    thread, _ = _in_thread(backend.get_action, a, np.zeros(3, np.float32))
    _step(backend)
    thread.join(5)
    # the client never reports back: after the timeout its episode ends truncated at its last observation
    start = time.monotonic()
    batch = backend.recv()
    assert 0.15 < time.monotonic() - start < 5
    assert batch.truncated[0] and batch.valid[0]
    assert backend.stats()["episodes_timed_out"] == 1
    with pytest.raises(RequestError, match="sent nothing for 0.2 s"):
        backend.get_action(a, np.zeros(3, np.float32))


@pytest.mark.parametrize(
    "value, message",
    [
        ([0.1, 0.2], "has shape \\[2\\]; the space .* needs \\[3\\]"),
        ([[0.1], [0.2], [0.3]], "has shape \\[3, 1\\]"),
        (["a", "b", "c"], "not an array of numbers"),
        ([0.1, [0.2], 0.3], "not a rectangular array"),
        ({"dtype": "float32", "shape": [3], "data": "AAAA"}, "bytes do not hold shape"),
        ({"dtype": "object", "shape": [3], "data": ""}, "not a little-endian"),
        ({"shape": [3]}, "typed array needs"),
        ([1e39, 0.0, 0.0], "not finite float32"),
    ],
)
def test_observations_that_do_not_fit_the_space_are_400s(value, message):
    spec = obs_spec(BOX)
    with pytest.raises(RequestError, match=message) as e:
        protocol.observation(value, spec, np.empty(3, np.float32))
    assert e.value.status == 400


def test_structured_and_typed_observations_are_read():
    space = gym.spaces.Dict({"pos": BOX, "mode": gym.spaces.Discrete(3)})
    spec = obs_spec(space)
    out = protocol.observation({"pos": [0.1, 0.2, 0.3], "mode": 2}, spec, np.empty(spec.shape, np.float32))
    assert np.allclose(out, gym.spaces.flatten(space, {"mode": 2, "pos": np.array([0.1, 0.2, 0.3], np.float32)}))
    with pytest.raises(RequestError, match="keys \\['mode', 'pos'\\]"):
        protocol.observation({"pos": [0, 0, 0]}, spec, np.empty(spec.shape, np.float32))
    image = gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)
    client = PolicyClient(binary=True)
    typed = client._encode(np.arange(4, dtype=np.uint8).reshape(2, 2, 1))
    assert protocol.observation(typed, obs_spec(image), np.empty((2, 2, 1), np.uint8)).ravel().tolist() == [0, 1, 2, 3]
    with pytest.raises(RequestError, match="holds floats"):
        protocol.observation([[[0.5], [1]], [[2], [3]]], obs_spec(image), np.empty((2, 2, 1), np.uint8))


def test_a_slot_reused_before_its_end_is_stepped_keeps_the_new_episode():
    """A client ends its episode and starts the next at once, in the same slot: the new episode's
    first request waits for the step that reports the end, and is not taken for a silent start."""
    backend = _backend(num_envs=1, timeout=0.3)
    backend.reset()
    _step(backend)
    a = backend.start_episode("a")
    thread, _ = _in_thread(backend.get_action, a, np.zeros(3, np.float32))
    _step(backend)
    thread.join(5)
    backend.end_episode(a, np.ones(3, np.float32))
    b = backend.start_episode("b")  # the slot of a, whose end is not stepped yet
    thread, out = _in_thread(backend.get_action, b, np.full(3, 0.5, np.float32))
    time.sleep(0.5)  # longer than client_timeout_s: b asked, so it is not closed
    batch = _step(backend)  # reports a's end; b waits for the next step
    assert batch.terminated[0] and batch.obs[0].tolist() == [1.0] * 3
    batch = _step(backend, action=0)
    thread.join(5)
    assert out["value"] == 0 and batch.obs[0].tolist() == [0.5] * 3 and not batch.valid[0]
    assert backend.stats()["episodes_timed_out"] == 0


def test_logged_actions_are_what_the_step_takes():
    backend = _backend(num_envs=2)
    backend.accepts_logged_actions = True
    backend.reset()
    _step(backend)
    a, b = backend.start_episode(), backend.start_episode()
    logging, _ = _in_thread(backend.log_action, a, np.zeros(3, np.float32), np.int64(1))
    asking, out = _in_thread(backend.get_action, b, np.zeros(3, np.float32))
    _until(lambda: (backend._phase == 1).all())  # both posted
    batch = backend.recv()
    actions = backend.logged(torch.zeros(2, dtype=torch.long), batch)
    assert actions.tolist() == [1, 0]  # the client's own action in its row, the policy's in the other
    backend.send(actions, batch)
    logging.join(5)
    asking.join(5)
    assert not logging.is_alive() and out["value"] == 0


def _until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
