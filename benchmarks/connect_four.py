"""Connect four by self-play: one PPO policy shared by both players, then 200 games against a
uniform random legal-move player (half as first player, half as second).

    python benchmarks/connect_four.py [key=value ...] [--seeds 1 2 3] [--games 200]

Training settings come from configs/ppo/pettingzoo-pettingzoo.classic.connect_four_v3.yaml
(key=value overrides them). The trained policy plays deterministically (the argmax of its masked
distribution); every move it picks is checked against the env's action mask, and an illegal one
raises. Per seed it prints the games
won, drawn and lost, the win rate as first player, second player and overall, the training steps
and time, and how many games ended on the first step of a rollout (their loser's -1 lands where
no earlier decision of that rollout can take it: GAE drops it).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import shoal
from shoal.bench import seed_sweep_args
from shoal.config import load_yaml

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo" / "pettingzoo-pettingzoo.classic.connect_four_v3.yaml"


class IllegalMoveError(RuntimeError):
    """The trained policy chose a move its action mask forbids."""


def connect_four_env():
    with warnings.catch_warnings():  # importing a PettingZoo env module directly warns that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        from pettingzoo.classic import connect_four_v3
    return connect_four_v3.env()


@torch.inference_mode()
def play_vs_random(algo: shoal.PPO, games: int = 200, seed: int = 0) -> dict[str, float]:
    """Play ``games`` games of ``algo``'s policy (deterministic) against a uniform random legal
    move; the policy moves first in the even-numbered games. Raises IllegalMoveError if the policy
    ever picks an illegal move. Returns counts and win rates (first, second, overall)."""
    policy = algo.get_policy()
    rng = np.random.default_rng(seed)
    env = connect_four_env()
    outcome = {0: [], 1: []}  # by the policy's seat: +1 win, 0 draw, -1 loss
    for game in range(games):
        seat = game % 2
        ours = env.possible_agents[seat]
        env.reset(seed=seed + game)
        state, first = policy.initial_state(1), torch.ones(1, dtype=torch.bool)
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == ours:
                    outcome[seat].append(int(np.sign(reward)))
                env.step(None)
                continue
            mask = obs["action_mask"].astype(bool)
            if agent == ours:
                x = torch.as_tensor(obs["observation"], dtype=torch.float32)[None]
                action, _, state = policy.act(x, state, first, torch.from_numpy(mask)[None], deterministic=True)
                action, first = int(action), torch.zeros(1, dtype=torch.bool)
                if not mask[action]:
                    raise IllegalMoveError(
                        f"game {game}: the policy chose column {action}; legal columns were "
                        f"{np.flatnonzero(mask).tolist()}."
                    )
            else:
                action = int(rng.choice(np.flatnonzero(mask)))
            env.step(action)
    env.close()
    first, second = np.array(outcome[0]), np.array(outcome[1])
    both = np.concatenate([first, second])
    return {
        "games": games,
        "wins": int((both == 1).sum()),
        "draws": int((both == 0).sum()),
        "losses": int((both == -1).sum()),
        "win_first": float((first == 1).mean()),
        "win_second": float((second == 1).mean()),
        "win_rate": float((both == 1).mean()),
    }


class BoundaryLosses(shoal.Callback):
    """Counts finished games, and those whose loser's reward fell on the first step of a rollout:
    a reward on a row that did not act, with no earlier decision in the rollout to fold into."""

    def __init__(self):
        self.games = self.lost = 0

    def on_train_result(self, trainer, result):
        rollout = trainer.algorithm.buffer.rollout[:, :-1]
        k = trainer.backend.rows_per_env
        self.games += int(rollout["done"].reshape(-1, k, rollout.shape[1]).any(1).sum())
        first = rollout[:, 0]
        self.lost += int(((first["reward"] != 0) & ~first["valid"]).sum())


def main() -> int:
    args, overrides = seed_sweep_args(__doc__, games=(int, 200))
    print(
        f"{'seed':>4} {'steps':>9} {'train (s)':>9} {'games':>5} {'wins':>5} {'draws':>5} {'losses':>6} "
        f"{'win 1st':>7} {'win 2nd':>7} {'win all':>7} {'lost -1':>8}"
    )
    ok = True
    for seed in args.seeds:
        counter = BoundaryLosses()
        settings = {
            **load_yaml(CONFIG),
            **overrides,
            "seed": seed,
            "save_outputs": False,
            "verbose": 0,
            "callbacks": [counter],
        }
        start = time.perf_counter()
        with shoal.PPO(**settings) as algo:
            result = algo.learn()
            wall = time.perf_counter() - start
            out = play_vs_random(algo, args.games, seed=seed)
        ok &= out["win_rate"] >= 0.9
        print(
            f"{seed:>4} {result['timesteps_total']:>9,} {wall:>9.1f} {out['games']:>5} {out['wins']:>5} "
            f"{out['draws']:>5} {out['losses']:>6} {out['win_first']:>7.1%} {out['win_second']:>7.1%} "
            f"{out['win_rate']:>7.1%} {counter.lost / max(counter.games, 1):>8.2%}"
        )
    print("lost -1: share of training games whose loser's -1 fell on a rollout's first step (dropped by GAE)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
