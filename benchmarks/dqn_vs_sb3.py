"""DQN against Stable-Baselines3's DQN with the same settings, seed by seed.

CartPole-v1 runs shoal's defaults (rl-baselines3-zoo's CartPole settings, 50k steps); with --acrobot
also Acrobot-v1 with configs/dqn_acrobot.yaml (rl-zoo's Acrobot settings, 100k steps). SB3 gets the
same settings (its MlpPolicy with the same net_arch; plain DQN targets, shoal's default). Each run
is a fresh process with one torch thread; the final return is the mean of 20 deterministic
episodes; SPS is env steps per second of the training loop.

    python benchmarks/dqn_vs_sb3.py [--seeds 1 2 3] [--acrobot] [--skip-sb3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

SHOAL = """
import json, sys, time, torch, shoal
from shoal.config import load_yaml
settings = json.loads(sys.argv[1])
settings = {**(load_yaml(settings.pop("config")) if "config" in settings else {}), **settings}
steps = settings.pop("steps")
algo = shoal.DQN(save_outputs=False, verbose=0, **settings)
start = time.perf_counter()
algo.learn(steps)
wall = time.perf_counter() - start
print(json.dumps({"eval": algo.evaluate(20)["episode_reward_mean"], "wall": wall, "steps": algo.timesteps_total}))
"""

SB3 = """
import json, sys, time, torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.evaluation import evaluate_policy
s = json.loads(sys.argv[1])
model = DQN("MlpPolicy", gym.make(s["env"]), learning_rate=s["learning_rate"], batch_size=s["batch_size"],
            buffer_size=s["buffer_size"], learning_starts=s["learning_starts"], gamma=0.99,
            target_update_interval=s["target_update_interval"], train_freq=s["train_freq"],
            gradient_steps=s["gradient_steps"], exploration_fraction=s["exploration_fraction"],
            exploration_final_eps=s["exploration_final_eps"], policy_kwargs=dict(net_arch=[256, 256]),
            seed=s["seed"], verbose=0)
start = time.perf_counter()
model.learn(s["steps"])
wall = time.perf_counter() - start
mean = evaluate_policy(model, gym.make(s["env"]), 20, warn=False)[0]
print(json.dumps({"eval": float(mean), "wall": wall, "steps": int(model.num_timesteps)}))
"""

# the SB3 equivalent of each task's shoal settings
TASKS = {
    "CartPole-v1": (
        {"steps": 50_000},
        dict(
            learning_rate=2.3e-3,
            batch_size=64,
            buffer_size=100_000,
            learning_starts=1000,
            target_update_interval=10,
            train_freq=256,
            gradient_steps=128,
            exploration_fraction=0.16,
            exploration_final_eps=0.04,
            steps=50_000,
        ),
    ),
    "Acrobot-v1": (
        {"config": str(CONFIGS / "dqn_acrobot.yaml"), "steps": 100_000},
        dict(
            learning_rate=6.3e-4,
            batch_size=128,
            buffer_size=50_000,
            learning_starts=0,
            target_update_interval=250,
            train_freq=4,
            gradient_steps=-1,
            exploration_fraction=0.12,
            exploration_final_eps=0.1,
            steps=100_000,
        ),
    ),
}


def run(code: str, settings: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code, json.dumps(settings)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--acrobot", action="store_true")
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()
    tasks = ["CartPole-v1", "Acrobot-v1"] if args.acrobot else ["CartPole-v1"]
    print("| env | library | seed | steps | final return | wall s | SPS |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for env in tasks:
        shoal_settings, sb3_settings = TASKS[env]
        sps: dict[str, list[float]] = {"shoal": [], "SB3": []}
        for seed in args.seeds:
            contenders = [("shoal", SHOAL, {"env": env, "seed": seed, **shoal_settings})]
            if not args.skip_sb3:
                contenders.append(("SB3", SB3, {"env": env, "seed": seed, **sb3_settings}))
            for name, code, settings in contenders:
                out = run(code, settings)
                sps[name].append(out["steps"] / out["wall"])
                print(
                    f"| {env} | {name} | {seed} | {out['steps']:,} | {out['eval']:.1f} | {out['wall']:.1f} | "
                    f"{sps[name][-1]:,.0f} |",
                    flush=True,
                )
        if sps["SB3"]:
            ratio = statistics.mean(sps["shoal"]) / statistics.mean(sps["SB3"])
            summary.append(f"{env}: shoal / SB3 SPS = {ratio:.2f}x")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
