"""GRPO against PPO on CartPole-v1, both with the library defaults. For each algorithm and seed:
train for --steps env steps (every step the envs took counts, GRPO's waiting steps too), evaluate
10 deterministic episodes every --eval-every steps along the way (the learning curve), then 20 at
the end; solved means a final mean return >= 475. The table also gives the env steps at which an
evaluation first reached 475, and from which every later one did.

    python benchmarks/grpo_cartpole.py [--seeds 1 2 3] [--steps 300000] [--plot curves.png] [key=value ...]

``key=value`` overrides go to GRPO only (e.g. ``group_size=16 num_envs=32``). The wall time is
the training's alone (the evaluations along the way are left out). --plot writes both learning
curves (mean over seeds, min to max shaded) to a PNG.
"""

from __future__ import annotations

import sys
import time

import shoal
from shoal.bench import seed_sweep_args

Curve = list[tuple[int, float]]  # (env steps, mean deterministic evaluation return)
WIDTHS = (4, 4, 8, 9, 10, 9, 13, 14)  # the table's columns


class EvalCurve(shoal.Callback):
    """Evaluates 10 deterministic episodes whenever another ``every`` env steps are in, and keeps
    the time it took, so the training's own wall time can be told apart."""

    def __init__(self, every: int):
        self.every, self.next, self.seconds = every, every, 0.0
        self.curve: Curve = []

    def on_train_result(self, trainer: shoal.Trainer, result: dict) -> None:
        if trainer.timesteps_total >= self.next:
            start = time.perf_counter()
            self.curve.append((trainer.timesteps_total, trainer.evaluate(10)["episode_reward_mean"]))
            self.seconds += time.perf_counter() - start
            self.next += self.every


def run(preset: type[shoal.Trainer], seed: int, steps: int, eval_every: int, overrides: dict) -> dict:
    """One ``learn(steps)`` call (its learning-rate schedule spans the budget) with the curve taken on the way."""
    curve = EvalCurve(eval_every)
    kw = dict(env="CartPole-v1", seed=seed, save_outputs=False, verbose=0, callbacks=[curve])
    with preset(**kw, **overrides) as algo:
        curve.curve.append((0, algo.evaluate(10)["episode_reward_mean"]))
        start = time.perf_counter()
        algo.learn(steps)
        wall = time.perf_counter() - start - curve.seconds
        final = algo.evaluate(20)
        curve.curve.append((algo.timesteps_total, final["episode_reward_mean"]))
        return {
            "steps": algo.timesteps_total,
            "wall": wall,
            "eval": final["episode_reward_mean"],
            "eval_min": final["episode_reward_min"],
            "curve": curve.curve,
            "first_475": next((t for t, r in curve.curve if r >= 475), None),
            "held_475": held_from(curve.curve, 475),
        }


def held_from(curve: Curve, level: float) -> int | None:
    """The env steps from which every evaluation of ``curve`` reached ``level`` (None: not at the end)."""
    held = None
    for steps, ret in reversed(curve):
        if ret < level:
            break
        held = steps
    return held


def main() -> int:
    args, overrides = seed_sweep_args(
        __doc__, steps=(int, 300_000), eval_every=(int, 10_000), plot=(str, None), ppo_steps=(int, None)
    )
    results: dict[str, list[dict]] = {"GRPO": [], "PPO": []}
    header = ("algo", "seed", "steps", "wall (s)", "eval mean", "eval min", "first >= 475", "always >= 475")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, WIDTHS)) + "  solved")
    ok = True
    for name, preset in (("GRPO", shoal.GRPO), ("PPO", shoal.PPO)):
        for seed in args.seeds:
            steps = (args.ppo_steps or args.steps) if name == "PPO" else args.steps
            out = run(preset, seed, steps, args.eval_every, overrides if name == "GRPO" else {})
            results[name].append(out)
            solved = out["eval"] >= 475
            ok &= solved or name == "PPO"
            first, held = ("-" if out[k] is None else f"{out[k]:,}" for k in ("first_475", "held_475"))
            cells = (
                name,
                seed,
                f"{out['steps']:,}",
                f"{out['wall']:.1f}",
                f"{out['eval']:.1f}",
                f"{out['eval_min']:.1f}",
                first,
                held,
            )
            print(" ".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS)) + f"  {'yes' if solved else 'NO'}", flush=True)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    return 0 if ok else 1


def plot(results: dict[str, list[dict]], path: str) -> None:
    """Both algorithms' evaluation curves: the mean over seeds (on a shared grid of env steps,
    each seed's curve held at its last value in between), shaded from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, runs in results.items():
        end = max(r["curve"][-1][0] for r in runs)
        grid = np.linspace(0, end, 200)
        ys = []
        for r in runs:
            steps, returns = zip(*r["curve"])
            index = np.searchsorted(np.array(steps), grid, side="right") - 1
            ys.append(np.array(returns)[np.clip(index, 0, None)])
        stack = np.stack(ys)
        line = ax.plot(grid, stack.mean(0), label=f"{name} (mean of {len(runs)} seeds)")[0]
        ax.fill_between(grid, stack.min(0), stack.max(0), color=line.get_color(), alpha=0.2)
    ax.axhline(475, color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("deterministic evaluation return (10 episodes)")
    ax.set_title("CartPole-v1: GRPO vs PPO, library defaults")
    ax.set_ylim(0, 520)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
