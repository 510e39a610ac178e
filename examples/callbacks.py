"""Callbacks: a metric of your own, and a stop once the task is solved.

``on_episode_end`` adds to ``episode.custom_metrics``; shoal aggregates each entry over the same
window as the returns and logs it as ``custom_metrics/<name>_mean`` (and ``_min``, ``_max``).
Any hook that returns True stops the run after the current iteration, with a checkpoint.

    python examples/callbacks.py [total_timesteps]
"""

from __future__ import annotations

import sys
from typing import Any

import shoal


# --8<-- [start:callback]
class PoleMetrics(shoal.Callback):
    def __init__(self, solved_at: float = 475.0):
        self.solved_at = solved_at

    def on_episode_end(self, trainer: shoal.Trainer, episode: shoal.Episode) -> None:
        episode.custom_metrics["survived_100"] = float(episode.episode_length >= 100)

    def on_train_result(self, trainer: shoal.Trainer, result: dict[str, Any]) -> bool:
        return result["episode_reward_mean"] >= self.solved_at


# --8<-- [end:callback]


if __name__ == "__main__":
    total_timesteps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with shoal.PPO(env="CartPole-v1", callbacks=[PoleMetrics()], seed=1) as algo:
        result = algo.learn(total_timesteps)
        print(
            f"stopped after {result['timesteps_total']} steps ({algo.stop_reason or 'budget'}): "
            f"return {result['episode_reward_mean']:.1f}, "
            f"survived 100 steps in {result['custom_metrics']['survived_100_mean']:.0%} of episodes"
        )
