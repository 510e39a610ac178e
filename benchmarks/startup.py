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

def first_step(self, action):
    print(time.time() - float(os.environ["STARTED"]), flush=True)
    os._exit(0)

CartPoleEnv.step = first_step
from shoal.cli import main
sys.exit(main(["train", "CartPole-v1", "save_outputs=false"]))
"""


def seconds(command: list[str], cwd: str, printed: bool) -> float:
    """Wall time of ``command``, or, with ``printed``, the number it prints (the first-step script's
    time since the interpreter started; a run that never steps CartPole in this process is an error)."""
    started = time.time()
    done = subprocess.run(
        command, cwd=cwd, env=os.environ | {"STARTED": repr(started)}, capture_output=True, text=True, check=True
    )
    if not printed:
        return time.time() - started
    lines = done.stdout.strip().splitlines()
    try:
        return float(lines[-1])
    except (IndexError, ValueError):
        raise SystemExit(f"{command[-1][:40]!r}... printed no time of its first step: {lines[-1:]}") from None


def import_seconds(module: str) -> dict[str, float]:
    """Cumulative import time of each module imported by ``import module`` (with all it imported
    in turn), by ``python -X importtime``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    times: dict[str, float] = {}
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
    commands = {  # name -> (command, whether it prints its own time)
        "shoal --version": ([shoal, "--version"], False),
        "shoal --help": ([shoal, "--help"], False),
        "shoal train CartPole-v1: first env step": ([sys.executable, "-c", FIRST_STEP], True),
    }
    with tempfile.TemporaryDirectory() as cwd:  # no run directory is left behind
        print(f"| command | median (s) | worst (s) |   ({args.runs} runs after a warm-up)\n|---|---|---|")
        for name, (command, printed) in commands.items():
            seconds(command, cwd, printed)
            times = [seconds(command, cwd, printed) for _ in range(args.runs)]
            print(f"| {name} | {statistics.median(times):.2f} | {max(times):.2f} |", flush=True)
    imports = import_seconds("shoal.train")
    torch, tensordict, shoal_train = (imports.get(m, 0.0) for m in ("torch", "tensordict", "shoal.train"))
    print(
        f"\nimport shoal.train: {shoal_train:.2f} s in all; torch {torch:.2f}, then tensordict {tensordict:.2f} "
        f"(of which torch._dynamo {imports.get('torch._dynamo', 0.0):.2f}, loaded by tensordict), "
        f"the rest (shoal's own modules and what they import) {shoal_train - torch - tensordict:.2f}"
    )


if __name__ == "__main__":
    main()
