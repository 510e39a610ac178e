"""An LSTM on TwoArmedBandit-v0, with and without the previous action and reward as inputs.

``TwoArmedBandit-v0`` (``shoal.envs.examples``): 20 pulls per episode, the better arm drawn anew
at each episode start and paying 1 with probability 0.9 (the other 0.1), the observation a
constant. Both runs use the same PPO settings and LSTM; one has ``model_config``
``use_prev_action`` and ``use_prev_reward``. The table gives the final 20-episode deterministic
evaluation as the mean reward per pull: about 0.9 is the better arm every pull, 0.5 a guess.

    python benchmarks/prev_action_reward.py [--seeds 1 2 3] [--steps 200000] [--plot curves.png]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import shoal
import shoal.envs.examples  # registers TwoArmedBandit-v0
from shoal.bench import seed_sweep_args, sweep_seeds

PULLS = 20
LEARNED = 0.8 * PULLS  # a return of 16 of 20: the better arm on most pulls
SETTINGS = dict(
    env="TwoArmedBandit-v0",
    tuned=False,
    num_envs=16,
    rollout_fragment_length=100,
    bptt_horizon=20,
    sgd_minibatch_size=400,
    num_sgd_iter=4,
    learning_rate=1e-3,
    gamma=0.9,
    gae_lambda=0.95,
    ent_coef=0.01,
)


def settings(use_prev: bool) -> Callable[[int], dict[str, Any]]:
    """A seed's settings: an LSTM of 64 units, with or without the previous action and reward."""
    model_config = {"core": "lstm", "core_size": 64, "use_prev_action": use_prev, "use_prev_reward": use_prev}
    return lambda seed: {**SETTINGS, "model_config": model_config, "seed": seed}


def main() -> int:
    args, _ = seed_sweep_args(__doc__, steps=(int, 200_000), eval_every=(int, 25_000), plot=(str, None))
    runs = {"LSTM": settings(False), "LSTM + previous action and reward": settings(True)}
    results = sweep_seeds(shoal.PPO, runs, args, LEARNED, "LSTM on TwoArmedBandit-v0 (return of 20 pulls)")
    for name, outs in results.items():
        per_pull = [out["eval"] / PULLS for out in outs]
        seeds = ", ".join(f"{p:.3f}" for p in per_pull)
        print(f"{name}: reward per pull {np.mean(per_pull):.3f} ± {np.std(per_pull):.3f} (seeds: {seeds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
