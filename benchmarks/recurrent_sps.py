"""Recurrent PPO's speed against feedforward PPO's: SPS of each on CartPoleNoVel-v1, with one torch
thread, at the tuned recurrent settings (``memory_cartpole.py``'s ``SETTINGS``: 16 envs, 32-step
fragments replayed whole, minibatches of 256 steps, 10 epochs; the LSTM of ``MODELS["lstm"]``
against the default MLP), and the time of each phase.

    python benchmarks/recurrent_sps.py [--seeds 1] [--steps 200000] [--eval 20] [--baseline-src DIR]

Each run trains in a fresh process of its own. Reported per model (medians over seeds):
  SPS          env steps / wall time of the training loop (set-up and evaluation excluded)
  rollout s    the collector's time (``sample_time_ms`` of every iteration, summed)
  learn s      the learner's (``learn_time_ms``, summed): advantages, epochs, minibatches
  other s      the rest of the loop (result dicts, statistics, logging)
  return       ``episode_reward_mean`` at the end of training (its last 100 episodes)
  eval         mean return of ``--eval`` deterministic episodes after training
and the ratio of the LSTM's SPS to the MLP's. The last row is the learner's bare-PyTorch ceiling,
timed in the same run: the same update (the same batch and minibatches, two ``nn.LSTM`` towers
with their heads, the PPO loss, Adam) on random segments in plain torch, each ``nn.LSTM`` run
over whole segments from their start states with no resets inside them (the ceiling: resets
only add work), its time scaled to the run's iterations.

``--baseline-src`` also runs every row with another checkout's ``src`` (``git worktree add
/tmp/base HEAD~1``), alternating with this one seed by seed, so the change's speed is compared on
the same machine in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import workers
from memory_cartpole import MODELS, SETTINGS

SEGMENT_STEPS, MINIBATCH = 32, 256  # PPO's defaults behind SETTINGS: whole 32-step fragments


# ----- workers: each runs in its own process and prints one JSON line ---------------------------
def run_ppo(model: str, seed: int, steps: int, episodes: int) -> dict:
    import shoal

    settings = {**SETTINGS, "model_config": MODELS[model], "total_timesteps": steps}
    algo = shoal.PPO(seed=seed, save_outputs=False, verbose=0, torch_threads=1, **settings)
    sample = learn = 0.0
    start = time.perf_counter()
    while algo.timesteps_total < steps:
        result = algo.train()
        sample += result["sample_time_ms"] / 1e3
        learn += result["learn_time_ms"] / 1e3
    wall = time.perf_counter() - start
    return {
        "sps": algo.timesteps_total / wall,
        "wall_s": wall,
        "rollout_s": sample,
        "learn_s": learn,
        "other_s": wall - sample - learn,
        "iterations": result["training_iteration"],
        "return": result["episode_reward_mean"],
        "eval": algo.evaluate(episodes)["episode_reward_mean"] if episodes else None,
    }


def run_ceiling(iterations: int) -> dict:
    """Seconds of ``iterations`` PPO updates of the LSTM learner in plain torch."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    size = MODELS["lstm"]["core_size"]
    head = MODELS["lstm"]["head_hiddens"][0]
    rows, epochs = SETTINGS["num_envs"], SETTINGS["num_sgd_iter"]
    obs_dim, actions = 2, 2
    cores = nn.ModuleList(nn.LSTM(obs_dim, size, batch_first=True) for _ in range(2))
    heads = nn.ModuleList(nn.Sequential(nn.Linear(size, head), nn.ReLU(), nn.Linear(head, out)) for out in (actions, 1))
    params = [*cores.parameters(), *heads.parameters()]
    optimizer = torch.optim.Adam(params, lr=SETTINGS["learning_rate"], eps=1e-5)
    segments = rows  # one fragment per env row
    obs = torch.randn(segments, SEGMENT_STEPS, obs_dim)
    action = torch.randint(0, actions, (segments, SEGMENT_STEPS))
    old_logp, adv, ret = (torch.randn(segments, SEGMENT_STEPS) for _ in range(3))
    start_h, start_c = (torch.randn(2, 1, segments, size) for _ in range(2))
    per_minibatch = MINIBATCH // SEGMENT_STEPS

    def update() -> None:
        for _ in range(epochs):
            for idx in torch.randperm(segments).split(per_minibatch):
                outs = [core(obs[idx], (start_h[i][:, idx], start_c[i][:, idx]))[0] for i, core in enumerate(cores)]
                logits, value = heads[0](outs[0]), heads[1](outs[1]).squeeze(-1)
                logp_all = logits.log_softmax(-1)
                logp = logp_all.gather(-1, action[idx].unsqueeze(-1)).squeeze(-1)
                entropy = -(logp_all.exp() * logp_all).sum(-1)
                a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
                ratio = (logp - old_logp[idx]).exp()
                pg = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)).mean()
                loss = pg + 0.5 * 0.5 * (value - ret[idx]).pow(2).mean() - 0.0 * entropy.mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                optimizer.step()

    update()  # warm-up
    repeats = 20
    start = time.perf_counter()
    for _ in range(repeats):
        update()
    return {"learn_s": (time.perf_counter() - start) / repeats * iterations}


WORKERS = {
    "ppo": lambda a: run_ppo(a["model"], a["seed"], a["steps"], a["episodes"]),
    "ceiling": lambda a: run_ceiling(a["iterations"]),
}


# ----- driver -------------------------------------------------------------------------------------
def spawn(kind: str, src: str | None = None, **args) -> dict:
    return workers.spawn(__file__, kind, src, **args)


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--eval", type=int, default=20, help="deterministic episodes after training (0: none)")
    parser.add_argument("--baseline-src", help="another checkout's src directory, run beside this one")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if workers.serve(args.worker, WORKERS):
        return

    sources = [("shoal", None)] + ([("baseline", args.baseline_src)] if args.baseline_src else [])
    runs: dict[tuple[str, str], list[dict]] = {(who, m): [] for who, _ in sources for m in ("mlp", "lstm")}
    for seed in args.seeds:  # sources and models alternate seed by seed: machine load hits all alike
        for who, src in sources:
            for model in ("mlp", "lstm"):
                out = spawn("ppo", src, model=model, seed=seed, steps=args.steps, episodes=args.eval)
                runs[who, model].append(out)
                print(f"  {who} {model} seed {seed}: {out}", file=sys.stderr, flush=True)
    iterations = runs["shoal", "lstm"][0]["iterations"]
    ceiling = spawn("ceiling", iterations=iterations)

    print(
        f"\nCartPoleNoVel-v1, {args.steps:,} steps, seeds {args.seeds}, 1 torch thread, "
        f"{SETTINGS['num_envs']} envs x {SEGMENT_STEPS} steps, minibatch {MINIBATCH}, "
        f"{SETTINGS['num_sgd_iter']} epochs; medians over seeds"
    )
    header = (
        f"{'run':24} {'SPS':>8} {'wall s':>8} {'rollout s':>10} {'learn s':>8} {'other s':>8} {'return':>7} {'eval':>7}"
    )
    print(header)

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for (who, model), rs in runs.items():
        cells = [fmt(median(rs, "sps"), ",.0f"), fmt(median(rs, "wall_s"), ".1f")]
        cells += [fmt(median(rs, k), ".1f") for k in ("rollout_s", "learn_s", "other_s", "return", "eval")]
        widths = (8, 8, 10, 8, 8, 7, 7)
        print(f"{who + ', ' + model:24} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    print(f"{'bare torch LSTM learner':24} {'':>8} {'':>8} {'':>10} {ceiling['learn_s']:>8.1f}")
    print()
    for who, _ in sources:
        ratio = median(runs[who, "lstm"], "sps") / median(runs[who, "mlp"], "sps")
        print(f"{who}: LSTM SPS / MLP SPS = {ratio:.3f}")
    learn = median(runs["shoal", "lstm"], "learn_s")
    print(f"shoal LSTM learn time / bare torch ceiling = {learn / ceiling['learn_s']:.2f}x")
    if args.baseline_src:
        speedup = median(runs["shoal", "lstm"], "sps") / median(runs["baseline", "lstm"], "sps")
        print(f"shoal / baseline LSTM SPS = {speedup:.2f}x")


if __name__ == "__main__":
    main()
