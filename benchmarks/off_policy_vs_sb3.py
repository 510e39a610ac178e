"""shoal's replay learners against Stable-Baselines3's with the same settings, seed by seed.

Tasks (rl-baselines3-zoo's tuned settings each, and its published return):

    dqn-cartpole   DQN, CartPole-v1, shoal's defaults, 50k steps        (zoo: 500)
    dqn-acrobot    DQN, Acrobot-v1, configs/dqn/Acrobot-v1.yaml, 100k      (zoo: -76)
    sac-pendulum   SAC, Pendulum-v1, configs/sac/Pendulum-v1.yaml, 20k     (zoo: -157)
    td3-pendulum   TD3, Pendulum-v1, configs/td3/Pendulum-v1.yaml, 20k     (zoo: -152)

SB3's DQN has no double Q-learning, which shoal's DQN uses by default (one more forward of the
online network per minibatch; `--set double_q=false` drops it). Each run is a fresh process with
one torch thread; both libraries stop at the same step count (the largest multiple of shoal's
iteration, whole collection phases of about 1,000 steps, within the budget); the final return is
the mean of 20 deterministic episodes; SPS is env steps per second of the training loop.

    python benchmarks/off_policy_vs_sb3.py [--tasks dqn-cartpole sac-pendulum ...] [--seeds 1 2 3] [--skip-sb3]
        [--set key=value ...]

`--set` overrides shoal's settings, e.g. `--set double_q=false` for DQN's exact SB3 settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from shoal.config import parse_overrides

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

SHOAL = """
import json, sys, time, torch, shoal
from shoal.config import load_yaml
s = json.loads(sys.argv[1])
settings = {**(load_yaml(s["config"]) if "config" in s else {}), "env": s["env"], "seed": s["seed"], **s["set"]}
settings.setdefault("tuned", False)  # the settings named here, not a tuned config beneath them
for key in ("algo", "total_timesteps"):  # the task names them
    settings.pop(key, None)
algo = shoal.Trainer(algo=s["algo"], save_outputs=False, verbose=0, timesteps_per_iteration=s["iteration"], **settings)
start = time.perf_counter()
algo.learn(s["steps"])
wall = time.perf_counter() - start
print(json.dumps({"eval": algo.evaluate(20)["episode_reward_mean"], "wall": wall, "steps": algo.timesteps_total}))
"""

SB3 = """
import json, sys, time, torch
torch.set_num_threads(1)
import gymnasium as gym
import numpy as np
import stable_baselines3
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise
s = json.loads(sys.argv[1])
kwargs = dict(s["sb3"])
noise = kwargs.pop("action_noise_std", None)
if noise is not None:
    kwargs["action_noise"] = NormalActionNoise(np.zeros(1), noise * np.ones(1))
kwargs["policy_kwargs"] = dict(net_arch=kwargs.pop("net_arch"))
if isinstance(kwargs.get("train_freq"), list):  # JSON has no tuples; SB3 reads (1, "episode") only as one
    kwargs["train_freq"] = tuple(kwargs["train_freq"])
model = getattr(stable_baselines3, s["algo"].upper())("MlpPolicy", gym.make(s["env"]), seed=s["seed"], **kwargs)
start = time.perf_counter()
model.learn(s["steps"])
wall = time.perf_counter() - start
mean = evaluate_policy(model, gym.make(s["env"]), 20, warn=False)[0]
print(json.dumps({"eval": float(mean), "wall": wall, "steps": int(model.num_timesteps)}))
"""

DQN_CARTPOLE = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    net_arch=[256, 256],
)
DQN_ACROBOT = dict(
    learning_rate=6.3e-4,
    batch_size=128,
    buffer_size=50_000,
    learning_starts=0,
    gamma=0.99,
    target_update_interval=250,
    train_freq=4,
    gradient_steps=-1,
    exploration_fraction=0.12,
    exploration_final_eps=0.1,
    net_arch=[256, 256],
)
TD3_PENDULUM = dict(
    learning_rate=1e-3,
    gamma=0.98,
    buffer_size=200_000,
    learning_starts=10_000,
    action_noise_std=0.1,
    train_freq=[1, "episode"],  # learning after each episode, as the zoo's settings and shoal's tuned config do
    gradient_steps=-1,
    net_arch=[400, 300],
)

# task -> shoal's algo and config, env, step budget, collection phase, SB3's keyword arguments
TASKS = {
    "dqn-cartpole": ("dqn", None, "CartPole-v1", 50_000, 256, DQN_CARTPOLE),
    "dqn-acrobot": ("dqn", "dqn/Acrobot-v1.yaml", "Acrobot-v1", 100_000, 4, DQN_ACROBOT),
    "sac-pendulum": (
        "sac",
        "sac/Pendulum-v1.yaml",
        "Pendulum-v1",
        20_000,
        1,
        dict(learning_rate=1e-3, net_arch=[256, 256]),
    ),
    "td3-pendulum": ("td3", "td3/Pendulum-v1.yaml", "Pendulum-v1", 20_000, 1, TD3_PENDULUM),
}


def run(code: str, settings: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code, json.dumps(settings)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tasks", nargs="+", choices=list(TASKS), default=["dqn-cartpole", "sac-pendulum", "td3-pendulum"]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="override shoal's settings")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    print("| task | library | seed | steps | final return | wall s | SPS |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for task in args.tasks:
        algo, config, env, budget, phase, sb3 = TASKS[task]
        iteration = phase * max(1, 1000 // phase)  # shoal's timesteps_per_iteration: whole phases
        steps = budget // iteration * iteration  # both stop at the same step within the budget
        common = {"algo": algo, "env": env, "steps": steps}
        shoal_settings = {**common, "iteration": iteration, "set": overrides}
        if config:
            shoal_settings["config"] = str(CONFIGS / config)
        sps: dict[str, list[float]] = {"shoal": [], "SB3": []}
        returns: dict[str, list[float]] = {"shoal": [], "SB3": []}
        for seed in args.seeds:
            contenders = [("shoal", SHOAL, {**shoal_settings, "seed": seed})]
            if not args.skip_sb3:
                contenders.append(("SB3", SB3, {**common, "seed": seed, "sb3": sb3}))
            for name, code, settings in contenders:
                out = run(code, settings)
                sps[name].append(out["steps"] / out["wall"])
                returns[name].append(out["eval"])
                print(
                    f"| {task} | {name} | {seed} | {out['steps']:,} | {out['eval']:.1f} | {out['wall']:.1f} | "
                    f"{sps[name][-1]:,.0f} |",
                    flush=True,
                )
        line = f"{task}: shoal return {statistics.mean(returns['shoal']):.1f}"
        if sps["SB3"]:
            ratio = statistics.mean(sps["shoal"]) / statistics.mean(sps["SB3"])
            line += f", SB3 {statistics.mean(returns['SB3']):.1f}; shoal / SB3 SPS = {ratio:.2f}x"
        summary.append(line)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
