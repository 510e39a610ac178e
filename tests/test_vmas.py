"""The VMAS backend: flat rows that are VMAS's agents, same-step autoreset, clear errors, PPO learns balance."""

import pytest
import torch

import shoal
from shoal.errors import ConfigError, EnvError
from shoal.vector import VmasBackend, make_backend

vmas = pytest.importorskip("vmas")

N, AGENTS, OBS = 4, 4, 16  # balance observations have 16 numbers


def _direct(seed: int, **config) -> "vmas.simulator.environment.Environment":
    """A plain VMAS env built and seeded the way the backend builds and seeds its own."""
    env = vmas.make_env("balance", num_envs=N, seed=seed, terminated_truncated=True, n_agents=AGENTS, **config)
    env.reset(seed=seed)
    return env


def test_flat_batch_shapes_dtypes_and_env_major_rows():
    backend = make_backend("vmas:balance", N, {"n_agents": AGENTS})
    assert isinstance(backend, VmasBackend) and backend.num_rows == N * AGENTS
    assert backend.act_spec.kind == "continuous" and backend.act_spec.shape == (2,)
    backend.reset(0)
    batch = backend.recv()
    assert batch.obs.shape == (N * AGENTS, OBS) and batch.obs.dtype == torch.float32
    assert batch.final_obs.shape == batch.obs.shape
    assert batch.reward.shape == (N * AGENTS,) and batch.reward.dtype == torch.float32
    for flags in (batch.terminated, batch.truncated, batch.valid):
        assert flags.shape == (N * AGENTS,) and flags.dtype == torch.bool
    assert batch.env_id.tolist() == [e for e in range(N) for _ in range(AGENTS)]
    buffers = [batch.obs.data_ptr(), batch.reward.data_ptr()]
    backend.send(torch.zeros(N * AGENTS, 2))
    assert backend.recv() is batch and [batch.obs.data_ptr(), batch.reward.data_ptr()] == buffers


def test_rows_are_the_agents_vmas_steps():
    """Row env*n_agents+agent holds what VMAS returns for that agent, given that row's action
    (out-of-range actions clipped for VMAS, as the backend must)."""
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(N * AGENTS, 2, generator=gen) * 3 - 1.5 for _ in range(3)]
    backend = make_backend("vmas:balance", N, {"n_agents": AGENTS})
    backend.reset(5)
    got = []
    for a in actions:
        backend.send(a)
        b = backend.recv()
        got.append((b.obs.clone(), b.reward.clone(), b.terminated.clone()))

    env = _direct(5)
    for a, (obs, reward, terminated) in zip(actions, got):
        per_agent = a.clamp(-1, 1).view(N, AGENTS, 2)
        o, r, te, tr, _ = env.step([per_agent[:, i] for i in range(AGENTS)])
        assert not (te.any() or tr.any())  # no resets yet: the two runs stay comparable
        for i in range(AGENTS):
            assert torch.equal(obs.view(N, AGENTS, OBS)[:, i], o[i])
            assert torch.equal(reward.view(N, AGENTS)[:, i], r[i])
        assert not terminated.any()


def _zero_steps(env, steps: int, restart_env0_at: int | None = None) -> list[torch.Tensor]:
    """Step a direct VMAS env with zero actions, never resetting; its obs [N, AGENTS, OBS] per step."""
    zeros = [torch.zeros(N, 2) for _ in range(AGENTS)]
    out = []
    for step in range(steps):
        if step == restart_env0_at:
            env.reset_at(0)
        out.append(torch.stack(env.step(zeros)[0], dim=1))
    return out


def test_truncation_resets_at_once_and_keeps_the_final_obs():
    """max_steps truncates; the env resets in the same step and final_obs holds the true last obs.
    Env 0 is restarted by hand before step 1, so at step 1 envs 1..3 end without it (the
    one-by-one reset path) and at step 2 env 0 ends alone."""
    reference = _zero_steps(_direct(3, max_steps=2), 3, restart_env0_at=1)
    backend = make_backend("vmas:balance", N, {"n_agents": AGENTS, "max_steps": 2})
    backend.reset(3)
    expected = [[False] * 4, [False, True, True, True], [True, False, False, False]]
    for step in range(3):
        if step == 1:
            backend.env.reset_at(0)
        backend.send(torch.zeros(N * AGENTS, 2))
        b = backend.recv()
        assert not b.terminated.any()
        trunc = b.truncated.view(N, AGENTS)
        assert torch.equal(trunc, trunc[:, :1].expand(N, AGENTS))  # an env's agents share its flags
        ended = trunc[:, 0]
        assert ended.tolist() == expected[step]
        obs, final = b.obs.view(N, AGENTS, OBS), b.final_obs.view(N, AGENTS, OBS)
        if ended.any():
            assert torch.equal(final[ended], reference[step][ended])  # the true last obs...
            assert not torch.equal(obs[ended], final[ended])  # ...while obs already starts the next episode
            assert backend.env.steps[ended].eq(0).all()
        if step < 2:  # later, envs 1..3 were reset here and not in the reference
            assert torch.equal(obs[~ended], reference[step][~ended])


def test_all_envs_done_reset_together():
    reference = _zero_steps(_direct(0, max_steps=2), 2)
    backend = make_backend("vmas:balance", N, {"n_agents": AGENTS, "max_steps": 2})
    backend.reset(0)
    for step in range(4):
        backend.send(torch.zeros(N * AGENTS, 2))
        b = backend.recv()
        assert b.truncated.all() if step % 2 else not b.truncated.any()
        assert backend.env.steps.eq(0 if step % 2 else 1).all()
        if step == 1:
            assert torch.equal(b.final_obs.view(N, AGENTS, OBS), reference[1])
            assert not torch.equal(b.obs, b.final_obs)


def test_termination_is_not_truncation():
    """Without max_steps an episode only ends by the scenario's done() (balance: the package or
    the line touches the floor), which is reported as terminated and reset at once."""
    backend = make_backend("vmas:balance", 16, {"n_agents": AGENTS})
    backend.reset(1)
    gen = torch.Generator().manual_seed(1)
    ended = 0
    for _ in range(60):
        backend.send(torch.rand(backend.num_rows, 2, generator=gen) * 2 - 1)
        b = backend.recv()
        assert not b.truncated.any()
        term = b.terminated.view(16, AGENTS)
        assert torch.equal(term, term[:, :1].expand(16, AGENTS))
        assert backend.env.steps[term[:, 0]].eq(0).all()
        ended += int(term[:, 0].sum())
    assert ended > 0


def test_discrete_actions():
    backend = make_backend("vmas:balance", N, {"n_agents": AGENTS, "continuous_actions": False})
    assert backend.act_spec.kind == "discrete" and backend.act_spec.nvec == (9,)
    backend.reset(0)
    before = backend.recv().obs.clone()
    backend.send(torch.full((N * AGENTS,), 8, dtype=torch.int64))  # 8: full thrust right and up
    assert not torch.equal(backend.recv().obs, before)


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(EnvError, match=r"unknown VMAS scenario 'balanse'\. Did you mean 'balance'\?.*Valid ones"):
        make_backend("vmas:balanse", 2)
    with pytest.raises(ConfigError, match="VMAS scenario.*num_workers=2"):
        make_backend("vmas:balance", 4, num_workers=2)
    with pytest.raises(EnvError, match="n_agent"):
        make_backend("vmas:balance", 2, {"n_agent": 4})
    with pytest.raises(ConfigError, match=r"env_config may not set \['seed'\]"):
        make_backend("vmas:balance", 2, {"seed": 1})
    with pytest.raises(EnvError, match=r"cannot be built.*assert self.n_agents > 1"):
        make_backend("vmas:balance", 2, {"n_agents": 1})
    with pytest.raises(EnvError, match="one observation shape and one action space.*adversary_0.*agent_0"):
        make_backend("vmas:simple_adversary", 2)
    with pytest.raises(ConfigError, match="num_workers"):
        shoal.PPO(env="vmas:balance", num_workers=1, num_envs=2, sgd_minibatch_size=64, save_outputs=False, verbose=0)
    algo = shoal.PPO(env="vmas:balance", num_envs=2, sgd_minibatch_size=64, save_outputs=False, verbose=0)
    with algo, pytest.raises(ConfigError, match="VMAS scenario"):
        algo.evaluate(1, video_dir=tmp_path)


def test_checkpoint_is_inexact_and_resume_starts_new_episodes(tmp_path):
    cfg = dict(
        env="vmas:balance",
        env_config={"n_agents": AGENTS, "max_steps": 20},
        num_envs=N,
        rollout_fragment_length=16,
        sgd_minibatch_size=64,
        num_sgd_iter=1,
        verbose=0,
    )
    with shoal.PPO(run_dir=str(tmp_path), **cfg) as algo:
        algo.learn(N * 16)
        assert algo.backend.state_dict()["exact"] is False
    with pytest.warns(UserWarning, match="starts new episodes"):
        resumed = shoal.PPO.from_checkpoint(tmp_path)
    with resumed:
        assert resumed.backend.env.steps.eq(0).all() and resumed.train()["timesteps_total"] == 2 * N * 16


# Measured with this test's settings (deterministic evaluation on 20 envs; learn(57_344) runs 7
# iterations = 229,376 agent steps), as the team's return (the sum over its 4 agents, whose rewards
# are shared): untrained about -6, trained about 51 / 97 / 97 on seeds 0 / 1 / 2.
BALANCE_THRESHOLD = 20.0


@pytest.mark.slow
def test_ppo_learns_balance():
    """Four agents learn to carry the package up, sharing one policy (about 10 s)."""
    algo = shoal.PPO(
        env="vmas:balance",
        env_config={"n_agents": AGENTS, "max_steps": 100},
        num_envs=128,
        rollout_fragment_length=64,
        sgd_minibatch_size=8192,
        num_sgd_iter=5,
        gamma=0.95,
        gae_lambda=0.95,
        learning_rate=3e-3,
        lr_schedule="constant",
        normalize_obs=True,
        normalize_reward=True,
        seed=0,
        save_outputs=False,
        verbose=0,
    )
    untrained = algo.evaluate(20)["episode_reward_mean"]
    algo.learn(57_344)
    trained = algo.evaluate(20)["episode_reward_mean"]
    assert untrained < BALANCE_THRESHOLD <= trained, (untrained, trained)
