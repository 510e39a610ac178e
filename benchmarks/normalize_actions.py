"""PPO with ``normalize_actions`` on Pendulum-v1 and on the same task with actions in [0, 100].

Three runs per seed, each with PPO's Pendulum-v1 settings for a plain Gaussian
(``configs/examples/pendulum_gaussian.yaml``, ``log_std_init`` included) and nothing else
changed: Pendulum-v1 with ``normalize_actions=True``; "Pendulum 0-100", whose torque is read from
a Box(0, 100) action (0 is -2, 100 is +2), with ``normalize_actions=True``; and Pendulum 0-100
without it, where the policy's Gaussian starts at 0 (full torque one way) with
a spread of about 0.6 on a range of 100. The table gives the final 20-episode deterministic
evaluation; a return of -200 counts as learned.

    python benchmarks/normalize_actions.py [--seeds 1 2 3] [--steps 300000] [--plot curves.png]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import shoal
from shoal.bench import seed_sweep_args, sweep_seeds
from shoal.config import load_yaml

LEARNED = -200.0
TUNED = Path(shoal.__file__).parent / "tuned" / "examples" / "pendulum_gaussian.yaml"


class Pendulum0To100(gym.ActionWrapper[Any, Any, Any]):
    """Pendulum-v1 whose torque comes as a number in [0, 100]."""

    def __init__(self) -> None:
        super().__init__(gym.make("Pendulum-v1"))
        self.action_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)

    def action(self, action: Any) -> Any:
        return np.asarray(action, np.float32) / 25.0 - 2.0


def with_seed(settings: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
    return lambda seed: {**settings, "seed": seed}


def main() -> int:
    args, _ = seed_sweep_args(__doc__, steps=(int, 300_000), eval_every=(int, 25_000), plot=(str, None))
    tuned = {k: v for k, v in load_yaml(TUNED).items() if k not in ("algo", "env", "total_timesteps")}
    runs = {
        "Pendulum-v1, normalized": {"env": "Pendulum-v1", "normalize_actions": True},
        "Pendulum 0-100, normalized": {"env": Pendulum0To100, "normalize_actions": True},
        "Pendulum 0-100, raw": {"env": Pendulum0To100, "normalize_actions": False},
    }
    seeded = {name: with_seed({**tuned, **settings}) for name, settings in runs.items()}
    sweep_seeds(shoal.PPO, seeded, args, LEARNED, "PPO on Pendulum with normalize_actions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
