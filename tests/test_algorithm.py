"""The Algorithm interface: an algorithm of the user's own (examples/reinforce.py) trained by the
unchanged trainer, chosen by ``algo=`` in Python, config and the command line, with its keys
checked and its state resumed exactly."""

import json

import pytest
import torch

import shoal
from examples.reinforce import Reinforce
from shoal.cli import main

FAST = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, verbose=0)


def _weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainer.get_policy().parameters()])


@pytest.mark.slow
def test_reinforce_written_as_an_algorithm_learns_cartpole_with_the_unchanged_trainer():
    with shoal.Trainer(algo=Reinforce, env="CartPole-v1", seed=1, save_outputs=False, verbose=0) as trainer:
        assert trainer.algo_name == "REINFORCE" and trainer.config.rollout_fragment_length == 128  # its own default
        assert trainer.config.batch_mode == "complete_episodes"
        first = trainer.train()
        trainer.learn(80_000)
        result = trainer.train()
        evaluation = trainer.evaluate(10)
    assert {"policy_loss", "vf_loss", "entropy", "episode_reward_mean", "sps"} <= result.keys()
    assert first["episode_reward_mean"] < 40 and evaluation["episode_reward_mean"] >= 300, evaluation


def test_a_custom_algorithm_resumes_exactly_from_its_checkpoint(tmp_path):
    kw = dict(FAST, algo=Reinforce, seed=4, normalize_obs=True, checkpoint_interval=0)
    straight = shoal.Trainer(run_dir=str(tmp_path / "a"), **kw)
    for _ in range(5):
        straight.train()
    first = shoal.Trainer(run_dir=str(tmp_path / "b"), **kw)
    for _ in range(2):
        first.train()
    path = first.save()
    first.close()
    resumed = shoal.Trainer.from_checkpoint(path)  # algo stored as 'examples.reinforce:Reinforce'
    assert resumed.config.algo == "examples.reinforce:Reinforce"
    for _ in range(3):
        resumed.train()
    assert torch.equal(_weights(resumed), _weights(straight))
    assert torch.equal(resumed.get_policy().obs_normalizer.stats.mean, straight.get_policy().obs_normalizer.stats.mean)
    straight.close()
    resumed.close()


def test_algo_is_chosen_on_the_command_line_and_in_yaml(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "CartPole-v1",
                "--algo",
                "examples.reinforce:Reinforce",
                "total_timesteps=1024",
                "--run-dir",
                str(tmp_path / "cli"),
                "--eval-episodes",
                "2",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["evaluation"]["episodes"] == 2
    assert "algo: examples.reinforce:Reinforce" in (tmp_path / "cli" / "config.yaml").read_text()
    config = tmp_path / "r.yaml"
    config.write_text("env: CartPole-v1\nalgo: examples.reinforce:Reinforce\nvf_coef: 0.25\ntotal_timesteps: 512\n")
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "yaml"), "--eval-episodes", "1"]) == 0
    assert main(["eval", str(tmp_path / "yaml"), "--episodes", "1"]) == 0  # the checkpoint names its algorithm
    assert main(["train", "--config", str(config), "--algo", "ppo"]) == 2
    assert "--algo ppo and algo=examples.reinforce:Reinforce disagree" in capsys.readouterr().err


def test_an_algorithms_own_keys_are_checked_like_the_common_ones():
    with pytest.raises(
        shoal.ConfigError, match=r"unknown config key 'vf_coeff' for ReinforceConfig. Did you mean 'vf_coef'"
    ):
        shoal.Trainer(algo=Reinforce, vf_coeff=0.5, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match=r"bad value for 'vf_coef': -1"):
        shoal.Trainer(algo=Reinforce, vf_coef=-1, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="unknown config key 'clip_coef' for ReinforceConfig"):
        shoal.Trainer(algo=Reinforce, clip_coef=0.2, save_outputs=False)  # PPO's key, not REINFORCE's


def test_target_kl_is_refused_where_the_step_records_no_approximate_kl():
    with pytest.raises(shoal.ConfigError, match=r"target_kl=0.01 .* which REINFORCE does not record"):
        shoal.Trainer(algo=Reinforce, target_kl=0.01, save_outputs=False, verbose=0)


def test_presets_train_their_own_algorithm_and_trainer_builds_any():
    ppo = dict(FAST, seed=3, sgd_minibatch_size=64, save_outputs=False)
    weights = []
    for make in (
        lambda: shoal.Trainer(algo="ppo", **ppo),
        lambda: shoal.PPO(**ppo),
    ):  # one after the other: one global RNG
        with make() as trainer:
            trainer.train()
            weights.append(_weights(trainer))
    assert torch.equal(*weights)
    with pytest.raises(shoal.ConfigError, match=r"shoal.PPO trains PPO; for algo=.*use shoal.Trainer\(algo=...\)"):
        shoal.PPO(algo=Reinforce, save_outputs=False)
    with pytest.raises(shoal.ConfigError, match="needs a shoal.Algorithm subclass"):
        shoal.register_algorithm("nope", dict)
    with pytest.raises(shoal.ConfigError, match="algo must be an algorithm name"):
        shoal.Trainer(algo=3, save_outputs=False)
    shoal.register_algorithm("reinforce", Reinforce)
    with shoal.Trainer(algo="REINFORCE", save_outputs=False, **FAST) as trainer:
        assert isinstance(trainer.algorithm, Reinforce)
        # checkpoints name it by import path: a new process has not registered the short name
        assert trainer.checkpoint_meta()["algo"] == "examples.reinforce:Reinforce"


def test_a_checkpoint_of_another_algorithm_is_refused_by_a_preset(tmp_path):
    with shoal.Trainer(algo=Reinforce, run_dir=str(tmp_path), **FAST) as trainer:
        trainer.train()
        path = trainer.save()
    with pytest.raises(shoal.CheckpointError, match="written by algo 'examples.reinforce:Reinforce', not 'ppo'"):
        shoal.PPO.from_checkpoint(path)
