"""What advantages cost: ``gae`` against ``vtrace`` (shoal.algos.returns) on one rollout's steps.

    python benchmarks/advantages.py [--steps 524288] [--length 64] [--repeats 5] [--valid 0.75]

Both run a backward scan whose time loop stays in Python, so their cost is about the number of
steps per row times the per-op overhead, plus the work per step. The ``--steps`` float32 steps
are laid out as short bptt segments (``steps / length`` rows of ``--length`` steps, what V-trace
recomputes per minibatch) and as long rollout rows (``--length`` rows of ``steps / length``
steps), each with every step a decision and with a ``--valid`` share of decision steps (the rest
folded into the decision before them: V-trace scans twice then). Episodes end every ~200 steps
(half terminated, half truncated); importance ratios are log-uniform in [0.2, 5]. Each figure is
the median of ``--repeats`` calls after a warm-up call, on 1 torch thread and on torch's default.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from shoal.algos.returns import gae, vtrace


def make_case(
    rows: int, length: int, valid_share: float | None, seed: int = 0
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """``gae``'s per-step arguments and the ratios, and the decision mask (None: every step)."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(rows, length, generator=g) < 1 / 200
    half = torch.rand(rows, length, generator=g) < 0.5
    log_ratio = torch.empty(rows, length).uniform_(math.log(0.2), math.log(5.0), generator=g)
    case = {
        "reward": torch.randn(rows, length, generator=g),
        "value": torch.randn(rows, length + 1, generator=g),
        "terminated": done & half,
        "truncated": done & ~half,
        "final_value": torch.randn(rows, length, generator=g),
        "ratio": log_ratio.exp(),
    }
    return case, None if valid_share is None else torch.rand(rows, length, generator=g) < valid_share


def median_ms(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and dispatch caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_both(case: dict[str, torch.Tensor], valid: torch.Tensor | None, repeats: int) -> tuple[float, float]:
    """Milliseconds of ``gae`` and of ``vtrace`` (default clips) on ``case``."""
    common = (case["reward"], case["value"], case["terminated"], case["truncated"], case["final_value"])

    def run_gae() -> torch.Tensor:
        return gae(*common, gamma=0.99, gae_lambda=0.95, valid_t=valid)

    def run_vtrace() -> torch.Tensor:
        return vtrace(*common, case["ratio"], gamma=0.99, gae_lambda=0.95, valid_t=valid)

    return median_ms(run_gae, repeats), median_ms(run_vtrace, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=524_288, help="float32 steps per layout")
    parser.add_argument("--length", type=int, default=64, help="segment length, and the rows of the long layout")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per figure; the median counts")
    parser.add_argument("--valid", type=float, default=0.75, help="share of decision steps in the masked runs")
    args = parser.parse_args()
    if args.steps % args.length:
        parser.error(f"--steps {args.steps} is not a multiple of --length {args.length}")
    other = args.steps // args.length
    layouts = {f"[{other}, {args.length}]": (other, args.length), f"[{args.length}, {other}]": (args.length, other)}
    default_threads = torch.get_num_threads()

    print(
        f"gae and vtrace on {args.steps:,} float32 steps, torch {torch.__version__}, {os.cpu_count()} CPU cores; "
        f"milliseconds, median of {args.repeats} after a warm-up"
    )
    print(f"{'layout [N, T]':<15}{'decisions':<11}{'threads':>8}{'gae ms':>10}{'vtrace ms':>11}{'vtrace/gae':>12}")
    for label, (rows, length) in layouts.items():
        for valid_share in (None, args.valid):
            case, valid = make_case(rows, length, valid_share)
            decisions = "all" if valid_share is None else f"{valid_share:.0%}"
            for threads in sorted({1, default_threads}):
                torch.set_num_threads(threads)
                gae_ms, vtrace_ms = time_both(case, valid, args.repeats)
                ratio = vtrace_ms / gae_ms
                print(f"{label:<15}{decisions:<11}{threads:>8}{gae_ms:>10.2f}{vtrace_ms:>11.2f}{ratio:>11.2f}x")
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
