"""The replay learners against their ceiling: the same gradient step in bare PyTorch, shoal's, and
end-to-end SPS of shoal and Stable-Baselines3 with the same settings.

For each of DQN (CartPole-v1, rl-zoo's sizes: two 256-unit layers, minibatches of 64, 128
minibatch steps after every 256 env steps, no double Q-learning, as SB3's DQN has none), SAC and
TD3 (Pendulum-v1: 256x256 actor and twin critics, minibatches of 256, one step per env step; TD3's
actor and targets every second step), three figures:

    bare    the gradient step in plain PyTorch with the fewest ops that compute it: minibatch drawn
            from flat tensors, fused Adam, twin critics as one batched network, TD3's actor loss
            through the first critic alone, targets moved by one foreach lerp, no host reads
    shoal   shoal's learner over its replay buffer (drawing, gathering and stepping), the same
            number of minibatch steps as a collection phase takes (``learn_from_replay``)
    SPS     env steps per second of whole training runs, shoal and SB3, after a warm-up past
            ``learning_starts``, one fresh process per run, each seed

Each row is one thread count (``--threads``; default one and all cores): the step rates in
updates/s (the paths timed in turns in one process, each the median of 5 rounds); "bound",
the env-step rate the bare step allows if collecting cost nothing (updates/s times env steps per
update); SPS of shoal (``torch_threads``) and of SB3 (``torch.set_num_threads``, left at torch's
default on the whole machine), each the mean of the seeds, the two libraries run in turns.

    python benchmarks/replay_ceiling.py [--algos dqn sac td3] [--seeds 1 2 3] [--threads 1 2]
        [--skip-sb3] [--updates 600] [--src DIR]

``--src`` imports shoal from another checkout's ``src`` (its figures beside this one's, to time a change).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

from workers import serve, spawn

# settings each library is given; shoal's keys, SB3's keyword arguments (named the same in both,
# but for the minibatch size, the network and double Q-learning, which SB3's DQN has not)
DQN_CARTPOLE = dict(
    train_freq=256,
    gradient_steps=128,
    learning_starts=1000,
    buffer_size=100_000,
    target_update_interval=10,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    gamma=0.99,
    learning_rate=2.3e-3,
)
TASKS = {
    "dqn": {
        "env": "CartPole-v1",
        "shoal": dict(  # SB3's DQN has neither advantage learning nor n-step returns, which the tuned config adds
            DQN_CARTPOLE,
            sgd_minibatch_size=64,
            double_q=False,
            advantage_learning=0.0,
            n_step=1,
            model_config={"hiddens": [256, 256]},
        ),
        "sb3": dict(DQN_CARTPOLE, batch_size=64, policy_kwargs={"net_arch": [256, 256]}),
        "warm": 2048,
        "window": 10240,
        "iteration": 1024,
        "steps_per_update": 2.0,
    },
    "sac": {
        "env": "Pendulum-v1",
        "shoal": dict(learning_rate=1e-3, learning_starts=100, model_config={"hiddens": [256, 256]}),
        "sb3": dict(learning_rate=1e-3, learning_starts=100, policy_kwargs={"net_arch": [256, 256]}),
        "warm": 500,
        "window": 1500,
        "iteration": 500,
        "steps_per_update": 1.0,
    },
    "td3": {
        "env": "Pendulum-v1",
        "shoal": dict(learning_rate=1e-3, learning_starts=100, gamma=0.98, model_config={"hiddens": [256, 256]}),
        "sb3": dict(learning_rate=1e-3, learning_starts=100, gamma=0.98, policy_kwargs={"net_arch": [256, 256]}),
        "sb3_noise": 0.2,  # shoal's exploration_noise 0.1 is a share of the half range, Pendulum's is 2
        "warm": 500,
        "window": 1500,
        "iteration": 500,
        "steps_per_update": 1.0,
    },
}
# the bare steps' sizes, as the tasks above set them
SIZES = {"dqn": dict(obs=4, act=2, batch=64, phase=128), "sac": dict(obs=3, act=1, batch=256, phase=1)}
SIZES["td3"] = SIZES["sac"]


ROUNDS = 5  # the two step rates are timed in turns, each the median of its rounds


def phase_runs(algo: str, threads: int) -> dict[str, Callable[[], None]]:
    """One phase of minibatch steps on each path: the bare step (bare_steps.py) over random
    transitions, and shoal's learner over a buffer filled by a short run."""
    import torch
    from bare_steps import BARE, dqn_written_out

    import shoal
    from shoal.algos.base import Statistics

    sizes, task = SIZES[algo], TASKS[algo]
    phase = sizes["phase"]
    step = BARE[algo](**sizes)
    runs = {"bare": lambda: step(phase)}
    if algo == "dqn":  # and the bare step with its backward written out: a lower bound on a hand-made one
        written_out = dqn_written_out(**sizes)
        runs["written out"] = lambda: written_out(phase)
    trainer = shoal.Trainer(
        algo=algo, env=task["env"], seed=1, save_outputs=False, verbose=0, torch_threads=threads, **task["shoal"]
    )
    trainer.learn(task["warm"])
    algorithm = trainer.algorithm
    totals = {pid: Statistics(algorithm.STAT_NAMES, torch.device("cpu")) for pid in algorithm.learners}
    return runs | {"shoal": lambda: algorithm.learn_from_replay(phase, 1.0, totals)}


def step_rates(args: dict) -> dict:
    """Updates/s of the bare step(s) and of shoal's, in turns (``ROUNDS`` of ``updates / ROUNDS``
    each after a warm-up), so that both see the machine as it is at the time."""
    import torch

    torch.set_num_threads(args["threads"])
    torch.manual_seed(0)
    runs = phase_runs(args["algo"], args["threads"])
    phase = SIZES[args["algo"]]["phase"]
    phases = max(1, args["updates"] // (phase * ROUNDS))
    for run in runs.values():
        for _ in range(max(1, 50 // phase)):
            run()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(phases):
                run()
            rates[name].append(phases * phase / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def shoal_sps(args: dict) -> dict:
    import shoal

    task = TASKS[args["algo"]]
    trainer = shoal.Trainer(
        algo=args["algo"], env=task["env"], seed=args["seed"], save_outputs=False, verbose=0,
        torch_threads=args["threads"], timesteps_per_iteration=task["iteration"], **task["shoal"],
    )  # fmt: skip
    trainer.learn(task["warm"])
    before, start = trainer.timesteps_total, time.perf_counter()
    trainer.learn(task["window"])
    return {"sps": (trainer.timesteps_total - before) / (time.perf_counter() - start)}


def sb3_sps(args: dict) -> dict:
    import gymnasium as gym
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.noise import NormalActionNoise

    if args["threads"]:
        torch.set_num_threads(args["threads"])  # 0: torch's default, as SB3 leaves it
    task = TASKS[args["algo"]]
    kind = getattr(stable_baselines3, args["algo"].upper())
    env = gym.make(task["env"])
    noise = {}
    if "sb3_noise" in task:
        dims = env.action_space.shape[0]
        noise["action_noise"] = NormalActionNoise(np.zeros(dims), task["sb3_noise"] * np.ones(dims))
    model = kind("MlpPolicy", env, seed=args["seed"], **task["sb3"], **noise)
    model.learn(task["warm"])
    before, start = model.num_timesteps, time.perf_counter()
    model.learn(task["window"], reset_num_timesteps=False)
    return {"sps": (model.num_timesteps - before) / (time.perf_counter() - start)}


WORKERS = {"steps": step_rates, "shoal": shoal_sps, "sb3": sb3_sps}


def mean_sps(algo: str, seeds: list[int], threads: int, src: str | None, sb3: bool) -> tuple[float, float]:
    """Mean SPS over ``seeds`` of shoal and of SB3 (nan when skipped), the two run in turns, seed
    by seed, so that a machine whose speed drifts (other tenants) weighs on both alike."""
    shoal_runs, sb3_runs = [], []
    sb3_threads = 0 if threads == os.cpu_count() else threads  # SB3 at torch's default on the whole machine
    for seed in seeds:
        shoal_runs.append(spawn(__file__, "shoal", src, algo=algo, seed=seed, threads=threads)["sps"])
        if sb3:
            sb3_runs.append(spawn(__file__, "sb3", None, algo=algo, seed=seed, threads=sb3_threads)["sps"])
    return statistics.mean(shoal_runs), statistics.mean(sb3_runs) if sb3_runs else math.nan


def row(algo: str, threads: int, args: argparse.Namespace, src: str | None, label: str) -> tuple[str, str | None]:
    """One table row: the step rates at ``threads`` torch threads, and SPS with as many (SB3 at
    its default when that is the whole machine); for DQN also a line on the written-out step."""
    rates = spawn(__file__, "steps", src, algo=algo, threads=threads, updates=args.updates)
    bare, learner = rates["bare"], rates["shoal"]
    sps, sb3 = mean_sps(algo, args.seeds, threads, src, not args.skip_sb3)
    per_update = TASKS[algo]["steps_per_update"]
    bound = bare * per_update
    line = None
    if "written out" in rates:
        fast = rates["written out"]
        versus = "" if math.isnan(sb3) else f", {fast * per_update / sb3:.2f}x SB3's SPS"
        line = (
            f"{algo}{label} at {threads} thread(s): the bare step with its backward written out runs "
            f"{fast:,.0f} updates/s ({fast / bare:.2f}x the bare step); its bound is {fast * per_update:,.0f} SPS"
            f"{versus}"
        )
    return (
        f"| {algo}{label} | {threads} | {bare:,.0f} | {learner:,.0f} | {learner / bare:.2f} | {bound:,.0f} "
        f"| {sps:,.0f} | {sps / bound:.2f} | {sb3:,.0f} | {sps / sb3:.2f}x |"
    ), line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--algos", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, nargs="+", help="torch threads of each row (default: 1 and the cores)")
    parser.add_argument("--updates", type=int, default=600, help="timed updates of each step rate")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--src", help="also time shoal imported from this checkout's src")
    args = parser.parse_args()
    if serve(args.worker, WORKERS):
        return 0
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    print(
        "| algo | threads | bare updates/s | shoal updates/s | shoal / bare | bound SPS | shoal SPS | shoal / bound "
        "| SB3 SPS | shoal / SB3 |"
    )
    print("|---|" + "---|" * 9)
    trees = [("", None)] + ([(" (--src)", args.src)] if args.src else [])
    lines = []
    for algo in args.algos:
        for count in threads:
            for label, src in trees:
                table_row, line = row(algo, count, args, src, label)
                print(table_row, flush=True)
                lines += [line] if line else []
    print("\n".join(["", *lines]) if lines else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
