"""What a native many-agent env saves: the same simulation as a shoal.AgentEnv and through dicts.

    python benchmarks/native_agents.py [--seconds 3] [--iterations 10] [--repeats 3] [--agents 128] [--envs 4]

TargetGrid (shoal.envs.examples: agents walking to targets on a grid, all stepped with numpy)
runs as a native env, writing its rows of the flat batch in place, and as a PettingZoo Parallel
env that hands the very same simulation's results out as per-agent dicts of fresh arrays and
reads per-agent action dicts, as Parallel and dict-API envs do. Both step on the serial backend
and on 2 worker processes. Prints agent-steps/s of the backend alone (random actions), of PPO's
collect phase and of PPO end to end (32 steps x envs x agents per iteration), each the best of
``--repeats`` runs, since other processes on the machine only ever slow a run down.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import shoal
from shoal.bench import env_sps
from shoal.envs.examples import TargetGrid
from shoal.envs.spaces import obs_spec
from shoal.vector.base import allocate_buffers


class TargetGridParallel:
    """TargetGrid through PettingZoo's Parallel API: the per-agent Python a native env skips."""

    metadata = {"name": "target_grid_parallel_v0"}

    def __init__(self, num_agents: int = 128, **kwargs):
        self.sim = TargetGrid(num_agents, **kwargs)
        self.sim.bind(allocate_buffers(num_agents, obs_spec(self.sim.single_observation_space), np.zeros))
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self._actions = np.zeros(num_agents, np.int64)

    def observation_space(self, agent: str):
        return self.sim.single_observation_space

    def action_space(self, agent: str):
        return self.sim.single_action_space

    def _each(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {a: rows[i].copy() for i, a in enumerate(self.possible_agents)}

    def reset(self, seed=None, options=None):
        self.sim.reset(seed)
        self.agents = list(self.possible_agents)
        return self._each(self.sim.obs), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        for i, agent in enumerate(self.possible_agents):
            self._actions[i] = actions[agent]
        self.sim.step(self._actions)
        over = bool(self.sim.truncated[0])  # every agent's episode ends on the same step
        obs = self._each(self.sim.final_obs if over else self.sim.obs)
        rewards = dict(zip(self.possible_agents, self.sim.reward.tolist()))
        terminations = dict.fromkeys(self.possible_agents, False)
        truncations = dict.fromkeys(self.possible_agents, over)
        if over:
            self.agents = []
        return obs, rewards, terminations, truncations, {a: {} for a in self.possible_agents}

    def close(self) -> None:
        pass


def ppo_sps(settings: dict, iterations: int) -> tuple[float, float, float]:
    """PPO agent-steps/s end to end and in the collect phase alone (env + policy forward), after a
    warm-up iteration, and the last iteration's mean return of one agent."""
    with shoal.PPO(**settings, save_outputs=False, verbose=0) as algo:
        algo.train()
        results = [algo.train() for _ in range(iterations)]
        k = algo.backend.rows_per_env
    steps = sum(r["timesteps_this_iter"] for r in results) * k
    total = sum(r["time_this_iter_s"] for r in results)
    collect = sum(r["sample_time_ms"] for r in results) / 1e3
    # Named agents' episode_reward_mean is the team's, smoothed over 100 team episodes (25
    # iterations here); the policy's is over 100 single agents' episodes, as a native env's.
    last = results[-1]
    per_agent = last["policy_reward_mean"]["default_policy"] if algo.backend.agents else last["episode_reward_mean"]
    return steps / total, steps / collect, per_agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per env-only run")
    parser.add_argument("--iterations", type=int, default=10, help="PPO iterations per row (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best counts")
    parser.add_argument("--agents", type=int, default=128)
    parser.add_argument("--envs", type=int, default=4)
    args = parser.parse_args()
    n, k = args.envs, args.agents
    kinds = {"native AgentEnv": lambda: TargetGrid(k), "Parallel dict API": lambda: TargetGridParallel(k)}
    ppo = {"num_envs": n, "rollout_fragment_length": 32, "sgd_minibatch_size": 2048, "num_sgd_iter": 1, "seed": 0}

    print(
        f"TargetGrid, {n} envs x {k} agents, {os.cpu_count()} CPU cores. Agent-steps/s of the backend alone "
        f"(random actions),\nof PPO's collect phase (env + policy forward) and of PPO end to end (+ update: "
        f"num_sgd_iter={ppo['num_sgd_iter']}, as Metta); return of one agent after {args.iterations + 1} iterations."
    )
    print(f"{'interface':<19}{'backend':<11}{'env only':>12}{'PPO collect':>13}{'PPO total':>11}{'return':>8}")
    figures = {}
    for kind, make in kinds.items():
        for workers in (0, 2):
            env_only = max(
                env_sps(make, n, num_workers=workers, seconds=args.seconds)["sps"] for _ in range(args.repeats)
            )
            runs = [ppo_sps({**ppo, "env": make, "num_workers": workers}, args.iterations) for _ in range(args.repeats)]
            total, collect, ret = max(r[0] for r in runs), max(r[1] for r in runs), runs[0][2]
            figures[kind, workers] = env_only, collect, total
            backend = f"{workers} workers" if workers else "serial"
            print(f"{kind:<19}{backend:<11}{env_only:>12,.0f}{collect:>13,.0f}{total:>11,.0f}{ret:>8.2f}")
    for workers in (0, 2):
        native, parallel = figures["native AgentEnv", workers], figures["Parallel dict API", workers]
        ratios = ", ".join(
            f"{what} {a / b:.1f}x" for what, a, b in zip(("env only", "collect", "total"), native, parallel)
        )
        print(f"native / dict, {f'{workers} workers' if workers else 'serial'}: {ratios}")


if __name__ == "__main__":
    main()
