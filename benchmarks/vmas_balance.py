"""PPO on VMAS balance (4 agents sharing one policy): throughput and a learning curve.

    python benchmarks/vmas_balance.py [--steps N] [--seed S] [--every K] [key=value ...]

Training settings come from configs/ppo/vmas-balance.yaml (key=value overrides them). Prints:
  * agent-steps/s of the backend alone (uniform random actions, autoresets included) and of
    end-to-end training (collect + PPO update);
  * the learning curve: mean training episode reward (last 100 agent-episodes) after the first
    and every K-th iteration, and a deterministic evaluation (20 episodes) before and after training.

The reward is balance's, shared by every agent each step: 100 x how much closer the package got
to its goal, and -10 when the package or the line touches the floor (which ends the episode). An
episode's return is thus about 100 x the distance the package was carried toward the goal (the
goal is about 1.4 away on average); a dropped package costs 10.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import shoal
from shoal.config import load_yaml, merge_settings, parse_overrides
from shoal.vector import make_backend

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo" / "vmas-balance.yaml"


def env_only(env: str, env_config: dict, num_envs: int, steps: int, seed: int) -> float:
    """Agent-steps/s of the backend with uniform random actions in the action bounds."""
    backend = make_backend(env, num_envs, env_config)
    space = backend.act_spec.space
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    gen = torch.Generator().manual_seed(seed)
    actions = [low + (high - low) * torch.rand(backend.num_rows, *low.shape, generator=gen) for _ in range(steps)]
    backend.reset(seed)
    start = time.perf_counter()
    for a in actions:
        backend.send(a)
        backend.recv()
    return backend.num_rows * steps / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps", type=int, default=None, help="env steps to train (default: the config's total_timesteps)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=5, help="iterations between learning-curve points")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    settings = merge_settings(load_yaml(CONFIG), parse_overrides(args.overrides))
    settings.update(seed=args.seed, save_outputs=False, verbose=0)
    torch.set_num_threads(settings.get("torch_threads", 1))

    env_sps = env_only(settings["env"], settings["env_config"], settings["num_envs"], 200, args.seed)
    curve = []
    with shoal.PPO(**settings) as algo:
        c = algo.config
        total = args.steps or c.total_timesteps
        rows = algo.backend.num_rows
        print(
            f"{c.env} {c.env_config}: {c.num_envs} envs x {rows // c.num_envs} agents = {rows} rows; "
            f"{rows * c.rollout_fragment_length:,} agent steps per iteration, {total * rows // c.num_envs:,} in all"
        )
        before = algo.evaluate(20)["episode_reward_mean"]
        start = time.perf_counter()
        while algo.timesteps_total < total:
            r = algo.train()
            it = r["training_iteration"]
            if it == 1 or it % args.every == 0 or algo.timesteps_total >= total:
                curve.append(
                    (
                        r["training_iteration"],
                        r["agent_timesteps_total"],
                        time.perf_counter() - start,
                        r["episode_reward_mean"],
                    )
                )
                print(
                    f"  iter {curve[-1][0]:>4}  {curve[-1][1]:>10,} agent steps  {curve[-1][2]:>6.1f} s  "
                    f"mean episode reward {curve[-1][3]:>7.2f}",
                    flush=True,
                )
        wall = time.perf_counter() - start
        after = algo.evaluate(20)["episode_reward_mean"]
        agent_steps = algo.timesteps_total * algo.backend.rows_per_env
        train_sps = agent_steps / wall

    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| env only, random actions (agent-steps/s) | {env_sps:,.0f} |")
    print(f"| end-to-end training (agent-steps/s) | {train_sps:,.0f} |")
    print(f"| training time (s) / agent steps | {wall:.0f} / {agent_steps:,} |")
    print(f"| team episode reward, first / last iteration (training) | {curve[0][3]:.2f} / {curve[-1][3]:.2f} |")
    print(f"| deterministic evaluation before / after (20 episodes) | {before:.2f} / {after:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
