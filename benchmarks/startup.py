"""How long a user waits: ``shoal --version``, ``shoal --help``, and ``shoal train CartPole-v1``
until its first env step, each timed from the start of a new interpreter (median and worst of
``--runs``), with where the time goes (the imports, by ``python -X importtime``).

    python benchmarks/startup.py [--runs 5]

The first run of each is a warm-up and not counted: the files it reads are then in the page
cache, as they are for a user's second command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Runs ``shoal train`` with CartPole's step wrapped: the first step prints the time since the
# interpreter started (the parent passes it in) and ends the process.
FIRST_STEP = """
import os, sys, time
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

step = CartPoleEnv.step

def first_step(self, action):
    print(time.time() - float(os.environ["STARTED"]), flush=True)
    os._exit(0)

CartPoleEnv.step = first_step
from shoal.cli import main
sys.exit(main(["train", "CartPole-v1", "save_outputs=false"]))
"""


def seconds(command: list[str], cwd: str) -> float:
    """Wall time of ``command``, or, when it prints a number (the first-step script), that number."""
    started = time.time()
    done = subprocess.run(
        command, cwd=cwd, env=os.environ | {"STARTED": repr(started)}, capture_output=True, text=True, check=True
    )
    printed = done.stdout.strip().splitlines()
    try:
        return float(printed[-1])
    except (IndexError, ValueError):
        return time.time() - started


def import_seconds(module: str) -> dict[str, float]:
    """Cumulative import time of each module imported by ``import module`` (with all it imported
    in turn), by ``python -X importtime``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    times = {}
    for line in done.stderr.splitlines():
        _, _, fields = line.partition("import time:")
        parts = fields.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            times.setdefault(parts[2].strip(), int(parts[1]) / 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    shoal = os.path.join(os.path.dirname(sys.executable), "shoal")
    commands = {
        "shoal --version": [shoal, "--version"],
        "shoal --help": [shoal, "--help"],
        "shoal train CartPole-v1: first env step": [sys.executable, "-c", FIRST_STEP],
    }
    with tempfile.TemporaryDirectory() as cwd:  # no run directory is left behind
        print(f"| command | median (s) | worst (s) |   ({args.runs} runs after a warm-up)\n|---|---|---|")
        for name, command in commands.items():
            seconds(command, cwd)
            times = [seconds(command, cwd) for _ in range(args.runs)]
            print(f"| {name} | {statistics.median(times):.2f} | {max(times):.2f} |", flush=True)
    times = import_seconds("shoal.train")
    parts = ["torch", "tensordict", "torch._dynamo", "gymnasium", "shoal.train"]
    print("\nimport times (s, each with what it imports): " + ", ".join(f"{m} {times.get(m, 0):.2f}" for m in parts))
    print("(tensordict imports torch._dynamo at load; shoal.train imports torch and tensordict)")


if __name__ == "__main__":
    main()
