"""CartPole-v1: shoal against Stable-Baselines3 with identical PPO settings, side by side.

Settings (rl-baselines3-zoo's CartPole PPO): 8 envs, 32 steps per env, minibatch 256, 20 epochs,
gamma 0.98, gae_lambda 0.8, learning rate 1e-3 annealed linearly to 0, clip 0.2, ent_coef 0,
64x64 tanh actor and critic, 100k steps. Both use one torch thread.

Each contender runs in its own fresh process, one after the other. Reported per run:
  sps          env steps / wall time of the training loop (set-up excluded)
  t475_s       wall time until the mean return of the last 100 training episodes first reaches 475
  eval         mean return of 20 deterministic episodes after training
Also shoal on 64 and 1,024 numpy-vectorized envs (gymnasium's vector_entry_point CartPole) with
the shipped configs/examples/cartpole_numpy64.yaml and cartpole_numpy1024.yaml (each run for its config's
total_timesteps), and the env-only SPS of each env set with random actions (the ceiling).

    python benchmarks/cartpole_vs_sb3.py [--seeds 1 2 3] [--skip-sb3] [--baseline-src DIR]

``--baseline-src`` also runs shoal's rows with another checkout's ``src`` (e.g. the previous
commit: ``git worktree add /tmp/prev HEAD~1``), alternating with this one seed by seed, so a
change's speed is compared on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import workers

TOTAL = 100_000
# vf_coef=1.0 on shoal's 0.5 * squared error is SB3's vf_coef=0.5 on plain MSE: the same loss.
ZOO = dict(
    num_envs=8,
    rollout_fragment_length=32,
    sgd_minibatch_size=256,
    num_sgd_iter=20,
    gamma=0.98,
    gae_lambda=0.8,
    learning_rate=1e-3,
    lr_schedule="linear",
    clip_coef=0.2,
    ent_coef=0.0,
    vf_coef=1.0,
    max_grad_norm=0.5,
)
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "examples"


# ----- workers: each runs in its own process and prints one JSON line ---------------------------
def run_shoal(seed: int, settings: dict) -> dict:
    import shoal

    settings = {"env": "CartPole-v1", "total_timesteps": TOTAL, **settings}
    algo = shoal.PPO(seed=seed, save_outputs=False, verbose=0, torch_threads=1, **settings)
    t475 = None
    start = time.perf_counter()
    while algo.timesteps_total < algo.config.total_timesteps:
        result = algo.train()
        if t475 is None and result["episode_reward_mean"] >= 475:
            t475 = time.perf_counter() - start
    wall = time.perf_counter() - start
    return {
        "sps": algo.timesteps_total / wall,
        "t475_s": t475,
        "wall_s": wall,
        "eval": algo.evaluate(20)["episode_reward_mean"],
    }


def run_sb3(seed: int) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=lambda remaining: 1e-3 * remaining,
        clip_range=0.2,
        ent_coef=0.0,
        seed=seed,
        verbose=0,
    )

    class Watch(BaseCallback):
        t475 = None

        def _on_rollout_end(self) -> None:
            buf = self.model.ep_info_buffer
            if Watch.t475 is None and buf and sum(e["r"] for e in buf) / len(buf) >= 475:
                Watch.t475 = time.perf_counter() - start

        def _on_step(self) -> bool:
            return True

    start = time.perf_counter()
    model.learn(TOTAL, callback=Watch())
    wall = time.perf_counter() - start
    mean, _ = evaluate_policy(
        model, make_vec_env("CartPole-v1", n_envs=1, seed=seed + 10_000), n_eval_episodes=20, deterministic=True
    )
    return {"sps": model.num_timesteps / wall, "t475_s": Watch.t475, "wall_s": wall, "eval": float(mean)}


def run_env_only(num_envs: int, vectorized: bool, steps: int) -> dict:
    import torch

    from shoal.vector import make_backend

    backend = make_backend("CartPole-v1", num_envs, vectorization_mode="vector_entry_point" if vectorized else None)
    backend.reset(0)
    actions = torch.randint(0, 2, (steps, num_envs))
    start = time.perf_counter()
    for t in range(steps):
        backend.send(actions[t])
        backend.recv()
    return {"sps": steps * num_envs / (time.perf_counter() - start)}


WORKERS = {
    "shoal": lambda a: run_shoal(a["seed"], a["settings"]),
    "sb3": lambda a: run_sb3(a["seed"]),
    "env": lambda a: run_env_only(a["num_envs"], a["vectorized"], a["steps"]),
}


# ----- driver -------------------------------------------------------------------------------------
def spawn(kind: str, src: str | None = None, **args) -> dict:
    return workers.spawn(__file__, kind, src, **args)


def summarize(runs: list[dict]) -> dict:
    hits = [r["t475_s"] for r in runs if r.get("t475_s") is not None]
    return {
        "sps": statistics.median(r["sps"] for r in runs),
        "t475_s": statistics.median(hits) if hits else None,
        "reached": f"{len(hits)}/{len(runs)}",
        "eval": statistics.mean(r["eval"] for r in runs) if "eval" in runs[0] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--baseline-src", help="another checkout's src directory, run beside this one")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if workers.serve(args.worker, WORKERS):
        return

    rows: list[tuple[str, dict]] = []
    from shoal.config import load_yaml

    shoal_rows = [
        ("8 envs (zoo settings)", ZOO),
        ("64 numpy envs", load_yaml(CONFIGS / "cartpole_numpy64.yaml")),
        ("1024 numpy envs", load_yaml(CONFIGS / "cartpole_numpy1024.yaml")),
    ]
    sources = [("shoal", None)] + ([("baseline", args.baseline_src)] if args.baseline_src else [])
    contenders = [[(f"{who}, {what}", "shoal", settings, src) for who, src in sources] for what, settings in shoal_rows]
    if not args.skip_sb3:
        contenders.insert(1, [("SB3 2.9, 8 envs (zoo settings)", "sb3", None, None)])
    for group in contenders:
        runs: dict[str, list] = {label: [] for label, *_ in group}
        for seed in args.seeds:  # the sources alternate seed by seed, so machine load hits both alike
            for label, kind, settings, src in group:
                runs[label].append(spawn(kind, src, seed=seed, settings=settings))
                print(f"  {label} seed {seed}: {runs[label][-1]}", file=sys.stderr, flush=True)
        rows += [(label, summarize(r)) for label, r in runs.items()]
    for label, n, vec, steps in [
        ("env only, 8 gym.Env, random actions", 8, False, 20_000),
        ("env only, 64 numpy envs, random actions", 64, True, 5_000),
        ("env only, 1024 numpy envs, random actions", 1024, True, 1_000),
    ]:
        rows.append(
            (
                label,
                {**spawn("env", num_envs=n, vectorized=vec, steps=steps), "t475_s": None, "reached": "-", "eval": None},
            )
        )

    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    print(f"\nCartPole-v1, seeds {args.seeds}: medians over seeds; 'reached' counts runs that got to 475;")
    print(f"8-env runs take {TOTAL:,} steps, numpy-env runs their config's total_timesteps; ", end="")
    print("eval = 20 deterministic episodes")
    print(f"{'run':44} {'SPS':>10} {'time to 475 (s)':>16} {'reached':>8} {'eval':>7}")
    for label, r in rows:
        sps, t475, ev = fmt(r["sps"], ",.0f"), fmt(r["t475_s"], ".1f"), fmt(r["eval"], ".1f")
        print(f"{label:44} {sps:>10} {t475:>16} {r['reached']:>8} {ev:>7}")
    table = dict(rows)
    if "SB3 2.9, 8 envs (zoo settings)" in table:
        ratio = table["shoal, 8 envs (zoo settings)"]["sps"] / table["SB3 2.9, 8 envs (zoo settings)"]["sps"]
        print(f"\nshoal / SB3 SPS at identical settings: {ratio:.2f}x")
    if args.baseline_src:
        for what, _ in shoal_rows:
            ratio = table[f"shoal, {what}"]["sps"] / table[f"baseline, {what}"]["sps"]
            print(f"shoal / baseline SPS, {what}: {ratio:.3f}x")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "cartpole_vs_sb3.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
