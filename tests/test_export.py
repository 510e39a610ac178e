"""Export: a policy written as ONNX or TorchScript acts as ``compute_actions(obs, deterministic=True)``
does, on any batch size, without shoal, a recurrent one step by step with its state carried; what
it cannot carry (action masks) and a file name or format of no known kind are refused."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import shoal
from shoal.cli import main

ort = pytest.importorskip("onnxruntime")

# a replay learner's 128 steps: one iteration, a gradient step after each 32 once 64 are stored
REPLAY = {"learning_starts": 64, "train_freq": 32, "gradient_steps": 1, "timesteps_per_iteration": 128}
RUNS = {  # (trainer, env, keys): Discrete and Box actor-critics, the CNN on pixels, a Q-network, SAC
    "ppo-discrete": (shoal.PPO, "CartPole-v1", {"normalize_obs": True}),
    "ppo-pixels": (shoal.PPO, "MinAtar/Breakout-v1", {"num_envs": 2, "rollout_fragment_length": 64}),
    "ppo-box": (shoal.PPO, "Pendulum-v1", {"normalize_obs": True, "num_envs": 2, "rollout_fragment_length": 64}),
    "dqn": (shoal.DQN, "CartPole-v1", REPLAY),
    "sac": (shoal.SAC, "Pendulum-v1", REPLAY),
}
RECURRENT = {  # an LSTM (state h and c), a GRU that also reads its previous action, a recurrent Q-network
    "ppo-lstm": (
        shoal.PPO,
        "CartPole-v1",
        {"model_config": {"core": "lstm"}, "num_envs": 2, "rollout_fragment_length": 32},
    ),
    "ppo-gru-prev-action": (
        shoal.PPO,
        "CartPole-v1",
        {"model_config": {"core": "gru", "use_prev_action": True}, "num_envs": 2, "rollout_fragment_length": 32},
    ),
    "dqn-lstm": (shoal.DQN, "CartPole-v1", {"model_config": {"core": "lstm"}} | REPLAY),
}


CONNECT_FOUR = "pettingzoo:pettingzoo.classic.connect_four_v3"  # legal moves come as action masks


@pytest.fixture(scope="module")
def trained():
    """``trained(name)``: the run ``name`` of RUNS or RECURRENT after 128 steps (its normalization
    statistics and weights moved off their start), made once for the module, since the tests
    only read it, and closed at the module's end."""
    runs = {}

    def run(name):
        if name not in runs:
            trainer, env, keys = (RUNS | RECURRENT)[name]
            algo = trainer(env=env, seed=1, save_outputs=False, verbose=0, **keys)
            algo.learn(128)
            runs[name] = algo  # only once it has learned: a failed run is made again by the next test
        return runs[name]

    yield run
    for algo in runs.values():
        algo.close()


def observations(algo, rows):
    space = algo.backend.obs_spec.space
    space.seed(3)
    return np.stack([space.sample() for _ in range(rows)]).astype(algo.backend.obs_spec.dtype)  # bool pixels too


def run_file(path, obs, state=None):
    """The file's actions for ``obs`` (and its next state, given the state ``{key: array}``): ONNX's
    by the names of its inputs and outputs, TorchScript's in the order of the state's keys."""
    state = state or {}
    if path.suffix == ".onnx":
        session = ort.InferenceSession(str(path))
        assert [i.name for i in session.get_inputs()] == ["obs", *state]
        names = [o.name for o in session.get_outputs()]
        assert names == ["action", *(f"next_{key}" for key in state)]
        out = dict(zip(names, session.run(None, {"obs": obs, **state})))
        return (out["action"], {key: out[f"next_{key}"] for key in state}) if state else out["action"]
    out = torch.jit.load(str(path))(torch.as_tensor(obs), *map(torch.as_tensor, state.values()))
    out = [t.numpy() for t in out] if isinstance(out, tuple) else [out.numpy()]
    return (out[0], dict(zip(state, out[1:]))) if state else out[0]


@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
@pytest.mark.parametrize("name", list(RUNS))
def test_the_exported_file_acts_as_compute_actions(tmp_path, trained, name, suffix):
    algo = trained(name)
    path = algo.export_policy(tmp_path / f"policy{suffix}")
    for rows in (1, 1000):  # the batch size is free
        obs = observations(algo, rows)
        expected = algo.compute_actions(obs, deterministic=True)
        actions = run_file(path, obs)
        assert actions.shape == expected.shape
        if algo.backend.act_spec.kind == "continuous":
            np.testing.assert_allclose(actions, expected, atol=1e-5)
            low, high = algo.backend.act_spec.space.low, algo.backend.act_spec.space.high
            assert (actions >= low).all() and (actions <= high).all()
        else:
            np.testing.assert_array_equal(actions, expected)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no partial file is left"


@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
@pytest.mark.parametrize("model", list(RECURRENT))
def test_a_recurrent_file_carries_its_state_as_compute_actions_does(tmp_path, trained, model, suffix):
    algo = trained(model)
    path = algo.export_policy(tmp_path / f"policy{suffix}")
    rows = 100  # ten steps of a hundred rows: 1,000 observations
    state = algo.get_policy().initial_state(rows)
    file_state = {key: value.numpy() for key, value in state.items()}
    for step in range(10):
        obs = observations(algo, rows) + np.float32(step)  # a different batch at each step
        expected, state = algo.compute_actions(obs, state, deterministic=True)
        actions, file_state = run_file(path, obs, file_state)
        np.testing.assert_array_equal(actions, expected)
        for key, value in state.items():  # float sums in another order, over ten steps
            np.testing.assert_allclose(file_state[key], value.numpy(), atol=1e-4)


RUN_WITHOUT_SHOAL = """
import sys
sys.modules["shoal"] = None  # as if it were not installed: importing it raises
import numpy as np
import onnxruntime
import torch

obs = np.load(sys.argv[1])
onnx = onnxruntime.InferenceSession(sys.argv[2]).run(None, {"obs": obs})[0]
script = torch.jit.load(sys.argv[3])(torch.as_tensor(obs)).numpy()
np.save(sys.argv[4], np.stack([onnx, script]))
"""


@pytest.mark.slow  # starts a process
def test_both_files_act_in_a_process_that_never_imports_shoal(tmp_path, trained):
    algo = trained("ppo-pixels")
    obs = observations(algo, 1000)
    expected = algo.compute_actions(obs, deterministic=True)
    files = [algo.export_policy(tmp_path / name) for name in ("policy.onnx", "policy.pt")]
    np.save(tmp_path / "obs.npy", obs)
    command = [sys.executable, "-c", RUN_WITHOUT_SHOAL, str(tmp_path / "obs.npy"), *map(str, files)]
    subprocess.run([*command, str(tmp_path / "actions.npy")], check=True, cwd=tmp_path, env={"PATH": ""})
    for actions in np.load(tmp_path / "actions.npy"):
        np.testing.assert_array_equal(actions, expected)


def test_the_command_line_exports_a_run_s_newest_checkpoint(tmp_path, capsys):
    with shoal.PPO(env="CartPole-v1", seed=1, verbose=0, run_dir=str(tmp_path / "run")) as algo:
        algo.learn(256)
        obs = observations(algo, 5)
        expected = algo.compute_actions(obs, deterministic=True)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out" / "cartpole.onnx")]) == 0
    assert "wrote" in capsys.readouterr().out
    np.testing.assert_array_equal(run_file(tmp_path / "out" / "cartpole.onnx", obs), expected)
    # with a format and no file, beside the run's checkpoints
    assert main(["export", str(tmp_path / "run"), "--format", "torchscript"]) == 0
    np.testing.assert_array_equal(run_file(tmp_path / "run" / "policy.pt", obs), expected)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out" / "named"), "--format", "onnx"]) == 0
    np.testing.assert_array_equal(run_file(tmp_path / "out" / "named.onnx", obs), expected)


def test_what_a_file_cannot_carry_is_refused(tmp_path, capsys):
    with (
        shoal.PPO(env=CONNECT_FOUR, tuned=False, seed=1, save_outputs=False, verbose=0) as algo,
        pytest.raises(shoal.ConfigError, match="acts under action masks"),
    ):
        algo.export_policy(tmp_path / "p.pt")
    with shoal.PPO(env="CartPole-v1", seed=1, save_outputs=False, verbose=0) as algo:
        with pytest.raises(
            shoal.ConfigError, match=r"cannot export to '.*p\.h5': name a file ending in \.onnx or \.pt, or give"
        ):
            algo.export_policy(tmp_path / "p.h5")
        with pytest.raises(shoal.ConfigError, match="unknown export format 'tflite': allowed are onnx, torchscript"):
            algo.export_policy(tmp_path / "p", format="tflite")
        with pytest.raises(shoal.ConfigError, match=r"cannot export onnx to '.*p\.pt': its suffix names torchscript"):
            algo.export_policy(tmp_path / "p.pt", format="onnx")
        with pytest.raises(shoal.ConfigError, match="no policy 'hunter'"):
            algo.export_policy(tmp_path / "p.pt", policy_id="hunter")
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "p.onnx")]) == 2
    assert "shoal: error" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert main(["export", str(tmp_path / "run")]) == 2  # neither a file nor a format
    assert "name the file to write (FILE), or its format" in capsys.readouterr().err
    (tmp_path / "run").rmdir()
    assert not list(tmp_path.iterdir()), json.dumps([p.name for p in tmp_path.iterdir()])
