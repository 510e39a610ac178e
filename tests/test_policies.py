"""Several policies: mapping rows at episode starts, one forward per policy, frozen policies, overrides."""

import pytest
import torch
from test_pettingzoo import GuessEnv

import shoal
from shoal.collect.policies import EpisodeStart
from tests.conftest import SHORT_TEAM_RUN

FAST = dict(
    env="CartPole-v1",
    num_envs=4,
    rollout_fragment_length=64,
    sgd_minibatch_size=64,
    num_sgd_iter=2,
    save_outputs=False,
    verbose=0,
    seed=3,
)


def alternate(agent_id: str, episode: EpisodeStart) -> str:
    """Envs take turns: even episodes to policy "a", odd ones to "b"."""
    return "ab"[episode.episode_id % 2]


def _force_action(policy, action: int) -> None:
    """Make ``policy`` choose ``action`` whatever it sees, so its rows can be told apart."""
    with torch.no_grad():
        policy.model.heads[0].bias.fill_(-50.0)
        policy.model.heads[0].bias[action] = 50.0


def _rollout(algo):
    rollout = algo.algorithm.buffer.start_rollout()
    algo.collector.collect(rollout)
    algo.algorithm.bootstrap_truncations(rollout, algo.collector.truncations)
    return rollout


def test_each_row_acts_by_the_policy_mapped_at_its_episode_start_with_one_forward_per_policy():
    with shoal.PPO(policies=["a", "b"], policy_mapping_fn=alternate, **FAST) as algo:
        _force_action(algo.get_policy("a"), 0)
        _force_action(algo.get_policy("b"), 1)
        calls = {"a": 0, "b": 0}
        for pid, policy in algo.policies.items():

            def counted(*args, _act=policy.act, _pid=pid, **kwargs):
                calls[_pid] += 1
                return _act(*args, **kwargs)

            policy.act = counted
        rollout = _rollout(algo)
    policy_id, action, done = rollout["policy_id"][:, :-1], rollout["action"][:, :-1], rollout["done"][:, :-1]
    assert torch.equal(action, policy_id)  # every row's step was taken by the policy it was mapped to
    assert policy_id[:, 0].tolist() == [0, 1, 0, 1]  # the envs' first episodes are 0..3
    switches = policy_id[:, 1:] != policy_id[:, :-1]
    assert switches.any() and not (switches & ~done[:, :-1]).any()  # switched only at episode starts
    # one batched forward per policy per step, and one on the last observation for the bootstrap value
    assert calls == {"a": 65, "b": 65}


def test_a_frozen_policy_keeps_its_weights_bit_for_bit_while_the_other_learns():
    with shoal.PPO(
        env=lambda: GuessEnv(),
        policies={"short": {}, "long": {"model_config": {"hiddens": [32]}}},
        policies_to_train=["short"],
        num_envs=4,
        rollout_fragment_length=20,
        sgd_minibatch_size=40,
        num_sgd_iter=2,
        save_outputs=False,
        verbose=0,
        seed=0,
    ) as algo:
        before = {pid: {k: v.clone() for k, v in p.state_dict().items()} for pid, p in algo.policies.items()}
        for _ in range(3):
            result = algo.train()
        acted = set(algo.algorithm.buffer.rollout["policy_id"].unique().tolist())
        after = {pid: p.state_dict() for pid, p in algo.policies.items()}
    assert acted == {0, 1}  # the frozen policy did act: it just never learned
    assert all(torch.equal(before["long"][k], after["long"][k]) for k in before["long"])
    assert not all(torch.equal(before["short"][k], after["short"][k]) for k in before["short"])
    assert after["long"]["model.heads.1.weight"].shape == (1, 32)  # its own network size
    assert "short/policy_loss" in result["learner"] and not any(k.startswith("long/") for k in result["learner"])
    assert set(result["policy_reward_mean"]) == {"short", "long"}


@pytest.mark.slow
def test_two_policies_each_learn_their_own_agent():
    with shoal.PPO(
        env=lambda: GuessEnv(),
        policies={"short": {}, "long": {"learning_rate": 3e-3}},
        **SHORT_TEAM_RUN,
    ) as algo:
        first = algo.train()
        algo.learn(8_000)
        result = algo.train()
        vs_random = algo.evaluate(8)
    assert first["learner"]["long/learning_rate"] == 3 * first["learner"]["short/learning_rate"]
    # maxima 3 and 5; random choices earn about 1.5 and 1.67
    assert first["policy_reward_mean"]["short"] < 2.2 and first["policy_reward_mean"]["long"] < 2.5
    assert result["policy_reward_mean"]["short"] > 2.6 and result["policy_reward_mean"]["long"] > 4.3
    assert vs_random["policy_reward_mean"]["long"] > 4.3


def test_evaluation_can_map_agents_to_other_policies():
    with shoal.PPO(policies=["a", "b"], policy_mapping_fn=alternate, **FAST) as algo:
        _force_action(algo.get_policy("b"), 0)  # always left: CartPole fails in about 10 steps
        out = algo.evaluate(4, policy_mapping_fn=lambda agent, episode: "b")
    assert set(out["policy_reward_mean"]) == {"b"} and out["policy_reward_mean"]["b"] < 15


@pytest.mark.slow
def test_multi_policy_runs_resume_exactly_and_match_on_worker_processes(tmp_path):
    kw = dict(
        FAST,
        policies={"a": {}, "b": {"model_config": {"hiddens": [16]}}},
        policy_mapping_fn="test_policies:alternate",
        save_outputs=True,
        checkpoint_interval=0,
    )
    with shoal.PPO(run_dir=str(tmp_path / "straight"), **kw) as straight:
        for _ in range(4):
            straight.train()
    with shoal.PPO(run_dir=str(tmp_path / "split"), **kw) as first:
        first.train()
        first.train()
        path = first.save()
    with shoal.PPO.from_checkpoint(path) as resumed:
        resumed.train()
        resumed.train()
    for pid in ("a", "b"):
        assert all(
            torch.equal(x, y) for x, y in zip(resumed.policies[pid].parameters(), straight.policies[pid].parameters())
        )
    serial = _rollout(shoal.PPO(policies=["a", "b"], policy_mapping_fn=alternate, **FAST))
    with shoal.PPO(policies=["a", "b"], policy_mapping_fn=alternate, num_workers=2, **FAST) as algo:
        workers = _rollout(algo)
    for key in ("obs", "action", "policy_id", "done"):
        assert torch.equal(serial[key], workers[key]), key


def test_a_mapping_function_that_cannot_be_stored_must_be_passed_again_on_resume(tmp_path):
    with shoal.PPO(
        policies=["a", "b"],
        policy_mapping_fn=lambda agent, ep: "a",
        **dict(FAST, save_outputs=True, run_dir=str(tmp_path)),
    ) as algo:
        path = algo.save()
    with pytest.raises(shoal.CheckpointError, match="policy_mapping_fn.*pass it again"):
        shoal.PPO.from_checkpoint(path)
    with shoal.PPO.from_checkpoint(path, policy_mapping_fn=alternate) as algo:
        assert algo.iteration == 0


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(policies={"a": {"hidens": [8]}}), "policy 'a' overrides 'hidens'.*Per-policy keys: model, model_config"),
        (
            dict(policies={"a": {"model_config": {"hidens": [8]}}}),
            "unknown model_config key 'hidens'.*Did you mean 'hiddens'",
        ),
        (dict(policies={"a": {"learning_rate": -1}}), "policy 'a': bad value for 'learning_rate'"),
        (dict(policies=["a", "b"], policies_to_train=["c"]), "'c' is not one of the policies"),
        (dict(policies={}), "policies is empty"),
        (dict(policies_to_train=["a"]), "set policies too"),
        (dict(policies=["a", "b"]), "not named like the agents"),
        (dict(policies=["a", "b"], policy_mapping_fn={"player": "a"}), "not the agents \\['agent_0'\\]"),
        (dict(policies=["a", "b"], policy_mapping_fn=lambda agent, ep: "main"), "mapped agent 'agent_0' to 'main'"),
        (dict(policies=["a", "b"], policy_mapping_fn="no_such_module:f"), "cannot be imported"),
    ],
)
def test_bad_policy_settings_name_the_problem(settings, message):
    with pytest.raises(shoal.ConfigError, match=message):
        shoal.PPO(**{**FAST, **settings})


def test_the_shipped_two_policy_yaml_config_trains_from_the_command_line(tmp_path, capsys):
    import json
    from pathlib import Path

    from shoal.cli import main

    config = Path(__file__).parent.parent / "configs" / "ppo" / "pettingzoo-mpe2.simple_adversary_v3.yaml"
    code = main(
        [
            "train",
            "--config",
            str(config),
            "total_timesteps=800",
            "num_envs=8",
            "sgd_minibatch_size=400",
            "--run-dir",
            str(tmp_path),
            "--eval-episodes",
            "2",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["evaluation"]["policy_reward_mean"]) == {"adversary", "good"}
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"policy_reward_mean/adversary", "learner/good/policy_loss", "learner/adversary/policy_loss"} <= set(logged)


def test_a_centralized_critic_sees_the_whole_team_and_bootstraps_truncations_from_the_team_final_obs():
    from test_pettingzoo import DyingAgentsEnv

    with shoal.PPO(
        env=lambda: DyingAgentsEnv(cut=2),
        central_critic="team_obs",
        num_envs=2,
        rollout_fragment_length=4,
        sgd_minibatch_size=24,
        save_outputs=False,
        verbose=0,
    ) as algo:
        rollout = _rollout(algo)
        policy = algo.get_policy()
    obs, critic_obs = rollout["obs"], rollout["critic_obs"]
    assert critic_obs.shape == (6, 5, 3 * 3 + 3)
    for row in range(6):  # a slow reference: the env's rows end to end, then the row's slot one-hot
        env, slot = divmod(row, 3)
        for t in range(5):
            want = torch.cat([obs[env * 3 : env * 3 + 3, t].reshape(-1), torch.eye(3)[slot]])
            assert torch.equal(critic_obs[row, t], want), (row, t)
    # every agent is truncated at step 2 (index 1): each bootstraps from the team's final obs
    final_team = torch.tensor([0, 2, 0, 1, 2, 0, 2, 2, 7.0])
    final_obs = final_team.reshape(3, 3)
    for row in range(6):
        slot = row % 3
        want = policy.value(final_obs[slot : slot + 1], torch.cat([final_team, torch.eye(3)[slot]]).unsqueeze(0))
        assert rollout["truncated"][row, 1] and torch.allclose(rollout["final_value"][row, 1], want[0])


@pytest.mark.slow
def test_ppo_with_a_centralized_critic_learns_and_single_agent_envs_are_refused():
    with shoal.PPO(
        env=lambda: GuessEnv(),
        central_critic="team_obs",
        **SHORT_TEAM_RUN,
    ) as algo:
        first = algo.train()
        algo.learn(8_000)
        result = algo.train()
    assert first["episode_reward_mean"] < 4.5 and result["episode_reward_mean"] > 7.0
    with pytest.raises(shoal.ConfigError, match="central_critic='team_obs' needs a multi-agent env; 'CartPole-v1'"):
        shoal.PPO(central_critic="team_obs", **FAST)


def test_anonymous_native_agents_are_mapped_by_their_slot():
    from shoal.envs.examples import TargetGrid

    half = lambda agent, episode: "even" if int(agent.removeprefix("agent_")) % 2 == 0 else "odd"  # noqa: E731
    with shoal.PPO(
        env=lambda: TargetGrid(num_agents=8, max_steps=4),
        policies=["even", "odd"],
        policy_mapping_fn=half,
        num_envs=2,
        rollout_fragment_length=8,
        sgd_minibatch_size=32,
        save_outputs=False,
        verbose=0,
    ) as algo:
        result = algo.train()
        policy_id = algo.algorithm.buffer.rollout["policy_id"][:, :-1]
    assert torch.equal(policy_id, (torch.arange(16) % 2).unsqueeze(1).expand(16, 8))
    assert {"even/policy_loss", "odd/policy_loss"} <= set(result["learner"])


class StateEnv(__import__("test_pettingzoo").DyingAgentsEnv):
    """DyingAgentsEnv with a global state: [step, agents left]."""

    state_space = __import__("gymnasium").spaces.Box(0, 10, (2,))

    def state(self):
        return [self.t, len(self.agents)]


STATE_CRITIC_RUN = dict(
    env=lambda: StateEnv(cut=2),
    central_critic="state",
    num_envs=2,
    rollout_fragment_length=4,
    sgd_minibatch_size=24,
    save_outputs=False,
    verbose=0,
)


def test_a_state_critic_sees_the_envs_global_state_and_bootstraps_from_the_state_before_the_reset():
    with shoal.PPO(**STATE_CRITIC_RUN) as algo:
        rollout = _rollout(algo)
        policy = algo.get_policy()
    critic_obs = rollout["critic_obs"]
    assert critic_obs.shape == (6, 5, 2 + 3)
    for row in range(6):  # episodes of 2 steps: the state counts 0, 1, 0, 1, 0 with all 3 agents in
        for t in range(5):
            assert critic_obs[row, t].tolist() == [t % 2, 3.0, *torch.eye(3)[row % 3].tolist()], (row, t)
    # truncated at step 2 (index 1): the state just before the reset, [2 steps, 0 agents left]
    final_obs = torch.tensor([[0, 2, 0], [1, 2, 0], [2, 2, 7.0]])
    for row in range(6):
        slot = row % 3
        want = policy.value(final_obs[slot : slot + 1], torch.tensor([[2.0, 0.0, *torch.eye(3)[slot].tolist()]]))
        assert torch.allclose(rollout["final_value"][row, 1], want[0])


@pytest.mark.slow
def test_a_state_critic_gets_the_same_inputs_from_worker_processes():
    with shoal.PPO(**STATE_CRITIC_RUN) as algo:
        serial = _rollout(algo)["critic_obs"]
    with shoal.PPO(**STATE_CRITIC_RUN, num_workers=2) as algo:
        assert torch.equal(_rollout(algo)["critic_obs"], serial)


def test_a_state_critic_needs_an_env_with_a_state():
    with pytest.raises(shoal.EnvError, match="central_critic='state' needs the env's global state.*'team_obs'"):
        shoal.PPO(env=lambda: GuessEnv(), central_critic="state", save_outputs=False, verbose=0)
    with pytest.raises(shoal.ConfigError, match="central_critic='state' needs a multi-agent env; 'CartPole-v1'"):
        shoal.PPO(central_critic="state", **FAST)


def test_critic_inputs_of_some_truncated_rows_carry_their_own_slot():
    """One agent of a 3-agent env truncating alone: its state input and its slot's one-hot."""
    from types import SimpleNamespace

    from shoal.collect.critic import EnvState

    batch = SimpleNamespace(final_state=torch.arange(12.0).reshape(6, 2), agent_id=torch.tensor([0, 1, 2] * 2))
    out = EnvState(2, 3).final(batch, torch.tensor([4]))
    assert out.tolist() == [[8.0, 9.0, 0.0, 1.0, 0.0]]
