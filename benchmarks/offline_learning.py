"""Offline learning figures: datasets recorded with shoal, then BC, MARWIL and CQL trained on them
and evaluated in the env, and the off-policy estimators checked against measured returns.

    python benchmarks/offline_learning.py [--out runs/offline-bench] [--seeds 1 2 3] [--stages ...]

Stages (each skips what its output folder already holds, so a run resumes):
  datasets    CartPole-v1: a PPO trained for 100k steps (its tuned config), recorded acting as in
              training for 200 episodes (expert, 100k steps); 100 of its episodes beside 50k steps
              of uniformly random actions (mixed). Pendulum-v1: the checkpoint of a SAC whose
              evaluation is nearest -400 (checked every 100 steps), recorded acting as in training
              for 500 episodes (medium, 100k steps).
  cartpole    BC on expert; BC, MARWIL and CQL on mixed; 200k recorded steps read each (20k
              minibatch steps), 20 deterministic evaluation episodes.
  pendulum    CQL on medium, 100k recorded steps read (10k minibatch steps of 256).
  estimators  IS, WIS, DM and DR on the first 100 expert episodes for BC's policy (trained on them,
              acting by sampling), against its discounted return (gamma 0.99) measured over 200
              episodes in the env; fitted Q evaluation with --fqe-iterations regressions.
The tables print at the end and go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

import shoal
from shoal.offline.info import dataset_summary
from shoal.train.recording import record_dataset

QUIET = dict(save_outputs=False, verbose=0)


def expert(out: Path) -> Path:
    run = out / "runs" / "ppo-cartpole"
    if not (run / "checkpoints").exists():
        with shoal.PPO(env="CartPole-v1", seed=100, run_dir=str(run), verbose=0) as ppo:
            ppo.learn(100_000)
    return run


def datasets(out: Path) -> None:
    run = expert(out)
    if not (out / "cartpole-expert").exists():
        record_dataset(run, out / "cartpole-expert", 200, explore=True, seed=7)
    mixed = out / "cartpole-mixed" / "default_policy"
    if not mixed.exists():
        record_dataset(run, out / "tmp-expert-half", 100, explore=True, seed=8)
        with shoal.DQN(
            env="CartPole-v1",
            seed=9,
            output=str(out / "tmp-random"),
            exploration_initial_eps=1.0,
            exploration_final_eps=1.0,
            learning_starts=10**9,
            **QUIET,
        ) as random_policy:
            random_policy.learn(50_000)
        mixed.mkdir(parents=True)
        shutil.move(out / "tmp-expert-half/default_policy/part-00000-v0", mixed / "part-00000-v0")
        shutil.move(out / "tmp-random/default_policy/part-00000-v0", mixed / "part-00001-v0")
        shutil.rmtree(out / "tmp-expert-half")
        shutil.rmtree(out / "tmp-random")
    if not (out / "pendulum-medium").exists():
        record_dataset(medium_sac(out), out / "pendulum-medium", 500, explore=True, seed=7)


def medium_sac(out: Path) -> Path:
    """The checkpoint of a SAC on Pendulum-v1 whose evaluation is nearest -400: SAC learns the swing-up
    within a few hundred steps, so it is checkpointed and evaluated every 100 steps until it is past."""
    run = out / "runs" / "sac-pendulum"
    scores = {}
    settings = dict(timesteps_per_iteration=100, keep_checkpoints=1000, verbose=0)
    with shoal.SAC(env="Pendulum-v1", seed=100, run_dir=str(run), **settings) as sac:
        while not scores or max(scores.values()) < -250:
            sac.learn(100)
            scores[sac.save()] = sac.evaluate(10, seed=123)["episode_reward_mean"]
    chosen = min(scores, key=lambda path: abs(scores[path] + 400))
    print(f"SAC checkpoint {chosen.name}: evaluation {scores[chosen]:.1f}", flush=True)
    return chosen


def learn(preset: type[shoal.Trainer], env: str, data: Path, seed: int, steps: int) -> dict:
    start = time.perf_counter()
    with preset(env=env, input=str(data), seed=seed, **QUIET) as algo:
        algo.learn(steps)
        score = algo.evaluate(20)["episode_reward_mean"]
    return {"return": score, "minutes": (time.perf_counter() - start) / 60}


def save(out: Path, key: str, row: dict) -> None:
    """Add one result to OUT/results.json as it is now (several seeds may run side by side)."""
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(results | {key: row}, indent=1))


def learners(out: Path, seeds: list[int], name: str, runs: list[tuple[str, type, str, str, int]]) -> None:
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    for label, preset, env, data, steps in runs:
        for seed in seeds:
            key = f"{name}/{label}/{seed}"
            if key not in results:
                results[key] = learn(preset, env, out / data, seed, steps)
                print(key, results[key], flush=True)
                save(out, key, results[key])


def measured_return(algo: shoal.Trainer, episodes: int, gamma: float, deterministic: bool) -> float:
    """The policy's mean discounted return over ``episodes`` episodes of CartPole-v1."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=50_000 + k)
        ret, discount, done = 0.0, 1.0, False
        while not done:
            action = algo.compute_actions(obs, deterministic=deterministic)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            ret += discount * float(reward)
            discount *= gamma
            done = terminated or truncated
        returns.append(ret)
    return float(np.mean(returns))


def estimators(out: Path, seeds: list[int], fqe_iterations: int) -> None:
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    data = out / "cartpole-expert"
    methods = ["is", "wis", "dm", "dr"]
    for seed in seeds:
        key = f"estimators/bc-fqe{fqe_iterations}/{seed}"
        if key in results:
            continue
        settings = dict(
            env="CartPole-v1",
            input=str(data),
            seed=seed,
            gamma=0.99,
            evaluation_deterministic=False,
            off_policy_estimation_methods=methods,
            off_policy_estimation_config={"iterations": fqe_iterations, "epochs_per_iteration": 1},
            **QUIET,
        )
        with shoal.BC(**settings) as bc:
            bc.learn(100_000)
            estimates = bc.estimate_off_policy()
            truth = measured_return(bc, 200, 0.99, deterministic=False)
        results[key] = {"true": truth, **estimates}
        print(key, results[key], flush=True)
        save(out, key, results[key])


def report(out: Path) -> None:
    results = json.loads((out / "results.json").read_text())
    print("\n| dataset | episodes | steps | return (mean ± std) |\n|---|---|---|---|")
    for name in ("cartpole-expert", "cartpole-mixed", "pendulum-medium"):
        if (out / name).exists():
            for row in dataset_summary(out / name):
                print(
                    f"| {name} | {row['episodes']} | {row['steps']:,} | {row['return_mean']:.1f} ± "
                    f"{row['return_std']:.1f} |"
                )
    groups: dict[str, list[dict]] = {}
    for key, row in results.items():
        groups.setdefault(key.rsplit("/", 1)[0], []).append(row)
    print("\n| run | seeds | return (mean ± std over seeds) | minutes per run |\n|---|---|---|---|")
    for group, rows in groups.items():
        if group.startswith("estimators"):
            continue
        returns = [r["return"] for r in rows]
        spread = statistics.pstdev(returns) if len(returns) > 1 else 0.0
        minutes = statistics.mean(r["minutes"] for r in rows)
        print(f"| {group} | {len(rows)} | {statistics.mean(returns):.1f} ± {spread:.1f} | {minutes:.1f} |")
    for group, est in groups.items():
        if not group.startswith("estimators"):
            continue
        print(f"\n{group}:")
        print("\n| estimator | mean estimate | true (measured) | error (mean ± std over seeds) |\n|---|---|---|---|")
        for method in ("v_behaviour", "is", "wis", "dm", "dr"):
            errors = [r[method] - r["true"] for r in est]
            values = [r[method] for r in est]
            print(
                f"| {method} | {statistics.mean(values):.2f} | {statistics.mean(r['true'] for r in est):.2f} | "
                f"{statistics.mean(errors):+.2f} ± {statistics.pstdev(errors):.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/offline-bench")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--stages", nargs="+", default=["datasets", "cartpole", "pendulum", "estimators"], help="what to run"
    )
    parser.add_argument("--fqe-iterations", type=int, default=300, help="fitted Q evaluation's regressions (dm, dr)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "datasets" in args.stages:
        datasets(out)
    if "cartpole" in args.stages:
        runs = [
            ("bc-expert", shoal.BC, "CartPole-v1", "cartpole-expert", 200_000),
            ("bc-mixed", shoal.BC, "CartPole-v1", "cartpole-mixed", 200_000),
            ("marwil-mixed", shoal.MARWIL, "CartPole-v1", "cartpole-mixed", 200_000),
            ("cql-mixed", shoal.CQL, "CartPole-v1", "cartpole-mixed", 200_000),
        ]
        learners(out, args.seeds, "cartpole", runs)
    if "pendulum" in args.stages:
        learners(out, args.seeds, "pendulum", [("cql-medium", shoal.CQL, "Pendulum-v1", "pendulum-medium", 100_000)])
    if "estimators" in args.stages:
        estimators(out, args.seeds, args.fqe_iterations)
    report(out)


if __name__ == "__main__":
    main()
