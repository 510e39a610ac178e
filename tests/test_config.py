"""Config keys and the checks made before anything is built."""

import subprocess
import sys

import pytest
import torch

import shoal
from shoal.config import PPOConfig, load_yaml, merge_settings, parse_overrides
from shoal.errors import ConfigError


def test_defaults_resolve_rollout_shape():
    c = PPOConfig.build()
    assert (c.num_envs, c.rollout_fragment_length, c.train_batch_size) == (8, 32, 256)
    c = PPOConfig.build(num_envs=4, train_batch_size=512)
    assert c.rollout_fragment_length == 128


def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'learing_rate'.*Did you mean 'learning_rate'\?"):
        PPOConfig.build(learing_rate=1e-3)


def test_conflicting_batch_sizes_name_numbers_and_suggest():
    with pytest.raises(
        ConfigError,
        match=r"train_batch_size=1000 must equal num_envs=8 x rollout_fragment_length=64 = 512"
        r".*rollout_fragment_length=125",
    ):
        PPOConfig.build(num_envs=8, rollout_fragment_length=64, train_batch_size=1000)
    with pytest.raises(
        ConfigError, match=r"train_batch_size=100 is not divisible by num_envs=8.*Try train_batch_size=96 or 104"
    ):
        PPOConfig.build(train_batch_size=100)
    with pytest.raises(
        ConfigError, match=r"sgd_minibatch_size=100 must divide the 256 agent steps.*Try sgd_minibatch_size=128"
    ):
        PPOConfig.build(sgd_minibatch_size=100).check_batch()
    with pytest.raises(
        ConfigError, match=r"sgd_minibatch_size=512 must divide the 256 agent steps.*Try sgd_minibatch_size=256"
    ):
        shoal.PPO(sgd_minibatch_size=512, save_outputs=False)
    with pytest.raises(
        ConfigError,
        match=r"sgd_minibatch_size=500 must divide the 768 agent steps.*x 3 agents\). Try sgd_minibatch_size=384",
    ):
        shoal.PPO(env="pettingzoo:mpe2.simple_spread_v3", sgd_minibatch_size=500, tuned=False, save_outputs=False)


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"bad value for 'gamma': 1.5"):
        PPOConfig.build(gamma=1.5)
    with pytest.raises(ConfigError, match=r"bad value for 'model_config.activation': 'gelu'"):
        PPOConfig.build(model_config={"activation": "gelu"})


def test_version_and_help_answer_without_importing_torch():
    """`shoal --version` and `--help` load neither torch nor the configs (they took 8 s when they did):
    checked by what was imported, and timed with a bound that a loaded machine still meets."""
    probe = (
        "import sys, time; t = time.perf_counter(); from shoal.cli import main\n"
        "for argv in (['--version'], ['--help'], ['train', '--help']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "print('torch' in sys.modules, 'shoal.config' in sys.modules, time.perf_counter() - t, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    torch_loaded, config_loaded, seconds = done.stderr.split()
    assert torch_loaded == config_loaded == "False", done.stderr
    assert float(seconds) < 2.0  # about 0.05 s on an idle machine


@pytest.mark.parametrize(
    "settings, message",
    [
        # each of these once escaped as another exception (found by tests/test_properties_config.py)
        (dict(seed=-1), r"bad value for 'seed': -1: Input should be greater than or equal to 0"),
        (dict(seed=2**32), r"bad value for 'seed': 4294967296: Input should be less than or equal to 4294967295"),
        (dict(torch_threads=10**6), r"bad value for 'torch_threads': 1000000"),  # was a segfault
        (dict(device="banana"), r"device='banana' is not a torch device"),
        (dict(clip_rewards=float("nan")), r"bad value for 'clip_rewards': nan"),  # was accepted
        (dict(learning_rate=float("inf")), r"bad value for 'learning_rate': inf: Input should be a finite number"),
        (
            dict(policies={"a": {"model_config": None}}),
            r"policy 'a' overrides model_config with None; it must be a dict",
        ),
        (dict(policies=["a", "b"], policy_mapping_fn={"agent_0": 7}), r"7 is not one of the policies \['a', 'b'\]"),
        # a union's type error says every type allowed, not only pydantic's first alternative
        (dict(clip_rewards="x"), r"bad value for 'clip_rewards': 'x': expected bool \| float \| None\.$"),
        (dict(policies=[5]), r"bad value for 'policies': \[5\]: expected dict\[str, .*\] \| list\[str\] \| None"),
    ],
)
def test_bad_values_are_config_errors_naming_them(settings, message):
    with pytest.raises(ConfigError, match=message):
        shoal.PPO(env="CartPole-v1", save_outputs=False, verbose=0, **settings)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_device_without_cuda_is_a_config_error():
    with pytest.raises(ConfigError, match=r"device='cuda:0', but torch finds no CUDA device here; use device='cpu'"):
        shoal.PPO(env="CartPole-v1", device="cuda:0", save_outputs=False, verbose=0)


def test_overrides_are_parsed_as_yaml_scalars():
    assert parse_overrides(
        [
            "seed=2",
            "model_config.hiddens=[32, 32]",
            "target_kl=null",
            "norm_adv=false",
            "env=CartPole-v1",
            "model_config.activation=relu",
            "policies.hunter.learning_rate=0.0001",
            "policies.hunter.gamma=0.9",
        ]
    ) == {
        "seed": 2,
        "model_config": {"hiddens": [32, 32], "activation": "relu"},
        "policies": {"hunter": {"learning_rate": 0.0001, "gamma": 0.9}},
        "target_kl": None,
        "norm_adv": False,
        "env": "CartPole-v1",
    }
    with pytest.raises(ConfigError, match="expected key=value, got 'seed'"):
        parse_overrides(["seed"])
    with pytest.raises(ConfigError, match=r"expected key=value, got 'model_config\.=\[32\]'"):
        parse_overrides(["model_config.=[32]"])
    assert merge_settings(
        {"policies": {"a": {"gamma": 0.9, "learning_rate": 1.0}, "b": None}},
        {"policies": {"a": {"learning_rate": 0.1}}},
    ) == {"policies": {"a": {"gamma": 0.9, "learning_rate": 0.1}, "b": None}}


def test_yaml_is_loaded_safely(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("seed: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_yaml(tmp_path / "list.yaml")


def test_version_is_one_value_for_the_package_and_the_command_line(capsys):
    from importlib.metadata import version

    from shoal.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"shoal {shoal.__version__}" == f"shoal {version('shoal')}"


@pytest.mark.parametrize(
    ("written", "count"), [("1e5", 100_000), ("100_000", 100_000), ("100k", 100_000), ("2.5k", 2_500), ("1M", 10**6)]
)
def test_counts_take_whole_numbers_written_as_people_write_them(written, count):
    assert shoal.config.PPOConfig.build(total_timesteps=written).total_timesteps == count
    assert shoal.config.PPOConfig.build(total_timesteps=float(count)).total_timesteps == count


def test_a_count_that_is_not_whole_is_refused_and_floats_and_strings_keys_are_left_alone():
    for bad in ("1.5", "1e-3", "2.5", "lots"):
        with pytest.raises(shoal.ConfigError, match=r"bad value for 'num_envs'"):
            shoal.config.PPOConfig.build(num_envs=bad)
    assert shoal.config.PPOConfig.build(learning_rate="1e-3").learning_rate == 1e-3  # a float key stays a float


def test_a_misspelt_key_names_the_three_nearest_keys_not_every_key():
    with pytest.raises(shoal.ConfigError) as e:
        shoal.config.PPOConfig.build(learing_rate=1e-3)
    message = str(e.value)
    assert "Did you mean 'learning_rate'? Nearest keys: 'learning_rate', " in message
    assert message.count("'") == 2 * 4 + 2  # the key given, 'did you mean' and three nearest keys


def test_progress_off_a_terminal_is_plain_lines_with_the_last_one_whole(capsys):
    with shoal.PPO(env="CartPole-v1", num_envs=2, sgd_minibatch_size=64, save_outputs=False, log_interval_s=0) as ppo:
        ppo.learn(512)  # pytest's captured stderr is not a terminal
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("PPO CartPole-v1: ")]
    assert len(lines) == 512 // 64  # one after every iteration of 2 envs x 32 steps
    assert lines[-1].startswith("PPO CartPole-v1: 512/512 steps (100%) | ") and lines[-1].endswith("eta 0:00:00")
    assert not any("\x1b" in line or "\r" in line for line in lines)
    with shoal.PPO(env="CartPole-v1", num_envs=2, sgd_minibatch_size=64, save_outputs=False, log_interval_s=0) as ppo:
        ppo.learn(100)  # two iterations of 64 steps: past the budget
    (last,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("PPO CartPole-v1: 128/")]
    assert last.startswith("PPO CartPole-v1: 128/100 steps (128%) | ") and last.endswith("eta 0:00:00"), last
    with shoal.PPO(env="CartPole-v1", num_envs=2, sgd_minibatch_size=64, save_outputs=False, verbose=0) as ppo:
        ppo.learn(128)
    assert "steps" not in capsys.readouterr().err
