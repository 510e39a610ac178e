"""Data-parallel learners: ranks that each learn on their share of a batch end with the parameters
one process gets from the whole batch; torchrun trains with them, end to end."""

import copy
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import shoal
from shoal import distributed
from shoal.errors import ConfigError

# One update on a rollout of 4 envs x 16 steps, read as one minibatch of 64 (or 2 x 32 on 2 ranks);
# three epochs, so the later ones start from parameters (and Adam moments) the ranks updated.
CONFIG = dict(
    env="CartPole-v1",
    tuned=False,
    seed=3,
    rollout_fragment_length=16,
    num_sgd_iter=3,
    save_outputs=False,
    verbose=0,
)
ENVS = 4


def _trainer(num_envs: int, fused: bool, **extra) -> shoal.Trainer:
    return shoal.PPO(num_envs=num_envs, sgd_minibatch_size=num_envs * 16, fused_update=fused, **CONFIG | extra)


def _parameters(trainer: shoal.Trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainer.get_policy().parameters()])


def _learn(trainer: shoal.Trainer, rollout, start: dict) -> tuple[torch.Tensor, int]:
    """The parameters after ``trainer`` folds ``rollout`` into its statistics and learns from it,
    starting from ``start``, and the epochs it took."""
    trainer.algorithm.load_state_dict(copy.deepcopy(start))
    trainer.algorithm.update_obs_stats(rollout)
    algorithm = trainer.algorithm
    stats = algorithm.learn(algorithm.learners["default_policy"], rollout, None)
    return _parameters(trainer), stats["num_sgd_epochs"]


class StopOnRankOne(shoal.Callback):
    """Asks for a stop after the second iteration, on rank 1 only."""

    def on_train_result(self, trainer, result):
        return distributed.rank() == 1 and trainer.iteration == 2


# (fused update, extra keys): the fused step and autograd, each plain and with the statistics the
# ranks must share (observation normalization; the KL that stops the update early)
CASES = [(fused, extra) for fused in (True, False) for extra in ({}, {"normalize_obs": True, "target_kl": 1e-5})]


def _rank(rank: int, world: int, port: int, path: str) -> None:
    """Rank ``rank``: each case's update on its share of the rollout rows, saved for the test."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        share = ENVS // world
        rows = slice(rank * share, (rank + 1) * share)
        results = []
        for (fused, extra), data in zip(CASES, torch.load(path, weights_only=False)):
            with _trainer(share, fused, **extra) as trainer:
                results.append(_learn(trainer, data["rollout"][rows].clone(), data["start"]))
        errors = {
            "grpo": _error(lambda: shoal.GRPO(**CONFIG)),
            "mismatch": _error(lambda: _trainer(share, True, gamma=0.99 + 0.001 * rank)),
        }
        replay = {}  # replay learners: each rank learns from its own replay, yet the ranks stay equal
        for algo, env in (("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")):
            small = dict(tuned=False, seed=3, save_outputs=False, verbose=0, model_config={"hiddens": [32]})
            with shoal.Trainer(
                algo=algo,
                env=env,
                learning_starts=32,
                train_freq=8,
                gradient_steps=2,
                timesteps_per_iteration=32,
                **small,
            ) as trainer:
                trainer.learn(256)
                replay[algo] = _parameters(trainer)
        # an instance, whose repr differs between the processes: the config check must look past it
        with _trainer(share, True, callbacks=[StopOnRankOne()]) as trainer:
            trainer.learn(64 * 10)
            stop = (trainer.iteration, trainer.stop_reason)
        torch.save({"results": results, "errors": errors, "stop": stop, "replay": replay}, f"{path}.rank{rank}")
    finally:
        dist.destroy_process_group()


def _error(build) -> str | None:
    """The config error building a trainer raises (None: it built)."""
    try:
        build().close()
    except ConfigError as e:
        return str(e)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_ranks_on_halves_of_a_batch_match_one_process_on_all_of_it(tmp_path):
    cases, singles = [], []
    for fused, extra in CASES:
        with _trainer(ENVS, fused, **extra) as trainer:
            start = copy.deepcopy(trainer.algorithm.state_dict())
            before = _parameters(trainer).clone()
            trainer.train()  # fills the rollout (and learns from it: _learn starts over from start)
            rollout = trainer.algorithm.buffer.rollout.clone()
            singles.append(_learn(trainer, rollout, start))
            assert not torch.equal(singles[-1][0], before)  # the update moved them
        cases.append({"rollout": rollout, "start": start})
    path = str(tmp_path / "cases.pt")
    torch.save(cases, path)
    mp.start_processes(_rank, args=(2, _free_port(), path), nprocs=2, start_method="spawn")
    ranks = [torch.load(f"{path}.rank{r}") for r in range(2)]
    for (fused, extra), (single, epochs), first, second in zip(CASES, singles, *(r["results"] for r in ranks)):
        case = f"fused={fused} {extra}"
        torch.testing.assert_close(first[0], second[0], rtol=0, atol=0, msg=f"{case}: the ranks differ")
        torch.testing.assert_close(
            first[0], single, rtol=0, atol=1e-5, msg=f"{case}: the ranks differ from one process"
        )
        # an epoch's KL is measured before each minibatch's step: the first epoch's is 0, the second's stops it
        assert first[1] == second[1] == epochs == (2 if "target_kl" in extra else 3), case
    for algo, first in ranks[0]["replay"].items():
        torch.testing.assert_close(first, ranks[1]["replay"][algo], rtol=0, atol=0, msg=f"{algo}: the ranks differ")
    for rank in ranks:
        assert "cannot learn on 2 data-parallel ranks: GRPO" in rank["errors"]["grpo"]
        assert "were given different configs: gamma differ" in rank["errors"]["mismatch"]
        assert rank["stop"] == (2, "callback")  # rank 1's callback stopped rank 0 at the same iteration


def test_without_a_process_group_the_collectives_are_no_ops():
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    x = torch.tensor([1.0, 2.0])
    assert distributed.sum_(x) is x and x.tolist() == [1.0, 2.0]
    assert distributed.average_(x).tolist() == [1.0, 2.0]
    assert distributed.any_rank(True) and not distributed.any_rank(False)
    assert distributed.differing_keys({"gamma": 0.9}) == []


@pytest.mark.slow
def test_torchrun_trains_cartpole_on_two_ranks_and_resumes(tmp_path):
    run = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", str(_free_port())]
    common = ["-m", "shoal", "train", "CartPole-v1", "seed=1", "checkpoint_interval=5", "torch_threads=1", "verbose=0"]
    first = subprocess.run(
        [*torchrun, *common, "total_timesteps=40960", "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count('"timesteps_total"') == 1  # rank 0 reports, alone
    assert '"timesteps_total": 40960' in first.stdout  # both ranks' steps: 2 x 8 envs x 32 steps x 80
    resumed = subprocess.run(
        [*torchrun, "-m", "shoal", "train", "--resume", str(run), "total_timesteps=81920"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(resumed.stdout)  # rank 0's summary, alone on stdout
    assert result["timesteps_total"] == 81920
    assert result["evaluation"]["episode_reward_mean"] >= 475
