"""PPO on SparseChain-v0 with and without the count-based bonus of ``examples/intrinsic_reward.py``.

``SparseChain-v0`` (``shoal.envs.examples``, 20 cells) pays 0.1 one step left of the start and
1.0 at the far right end. Both runs use PPO's defaults and the same seeds; the only difference is
the ``CountBonus`` callback, which adds ``0.1 / sqrt(visits)`` of each step's observation to the
learning reward. The table gives the final 20-episode deterministic evaluation, the env's own
return: 1.0 means the policy walks to the far end, 0.1 that it settled for the near one.

    python benchmarks/intrinsic_reward.py [--seeds 1 2 3] [--steps 100000] [--plot curves.png]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shoal
import shoal.envs.examples  # registers SparseChain-v0
from shoal.bench import seed_sweep_args, sweep_seeds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # makes examples.intrinsic_reward importable
from examples.intrinsic_reward import CountBonus

FAR_END = 1.0


def main() -> int:
    args, _ = seed_sweep_args(__doc__, steps=(int, 100_000), eval_every=(int, 10_000), plot=(str, None))
    runs: dict[str, Callable[[int], dict[str, Any]]] = {
        "PPO": lambda seed: {"env": "SparseChain-v0", "seed": seed},
        "PPO + count bonus": lambda seed: {"env": "SparseChain-v0", "seed": seed, "callbacks": [CountBonus()]},
    }
    title = "PPO on SparseChain-v0, with and without a count bonus"
    sweep_seeds(shoal.PPO, runs, args, FAR_END, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
