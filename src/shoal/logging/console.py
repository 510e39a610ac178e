"""Console progress for long runs: a live bar on a terminal (rich), plain lines elsewhere."""

from __future__ import annotations

import math
import sys
import time
from datetime import timedelta
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Mode = Literal["live", "lines", "off"]


def progress_mode(verbose: int) -> Mode:
    """``verbose`` 0: nothing; 1: the live bar when stderr is a terminal, plain lines elsewhere (a
    file, CI, a pipe); 2: plain lines everywhere."""
    if verbose <= 0:
        return "off"
    return "live" if verbose == 1 and Console(stderr=True).is_terminal else "lines"


class ProgressDisplay:
    """Progress over env steps with SPS and the mean episode return, on stderr (stdout holds
    results): a live bar (``live``), or a plain line at most every ``interval_s`` seconds and one
    at the end (``lines``), with no control characters, as a log file wants it."""

    def __init__(self, title: str, total_steps: int, mode: Mode, interval_s: float = 10.0):
        self.title, self.total, self.mode, self.interval_s = title, total_steps, mode, interval_s
        self.console = Console(stderr=True)
        self.start = self.last_line = time.perf_counter()
        self.steps, self.sps, self.ret = 0, 0.0, "-"
        self.steps_shown = 0  # the steps the last plain line gave
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=20),
            TextColumn("{task.completed:>9,.0f} steps"),
            TextColumn("{task.fields[sps]:>7,.0f} sps"),
            TextColumn("return {task.fields[ret]:>7}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(compact=True),
            console=self.console,
            disable=mode != "live",
        )
        self.task = self.progress.add_task(title, total=total_steps, sps=0.0, ret="-")

    def __enter__(self) -> ProgressDisplay:
        self.start = self.last_line = time.perf_counter()
        self.progress.start()
        return self

    def update(self, steps_done: int, result: dict[str, Any]) -> None:
        ret = result.get("episode_reward_mean", math.nan)
        self.steps, self.sps, self.ret = steps_done, result.get("sps", 0.0), "-" if ret != ret else f"{ret:.1f}"
        self.progress.update(self.task, completed=steps_done, sps=self.sps, ret=self.ret)
        if self.mode == "lines" and time.perf_counter() - self.last_line >= self.interval_s:
            self.write_line()

    def write_line(self) -> None:
        now = time.perf_counter()
        self.last_line, self.steps_shown, elapsed = now, self.steps, now - self.start
        share = self.steps / self.total if self.total else 1.0
        # a run's last phase may overshoot its budget (replay phases end with episodes): nothing is left
        eta = elapsed * max(1 - share, 0.0) / share if share > 0 else math.inf
        print(
            f"{self.title}: {self.steps:,}/{self.total:,} steps ({share:.0%}) | {self.sps:,.0f} sps | "
            f"return {self.ret} | elapsed {_clock(elapsed)} | eta {_clock(eta)}",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()
        if self.mode == "lines" and self.steps != self.steps_shown:  # the last line: where the run ended
            self.write_line()


def _clock(seconds: float) -> str:
    """``h:mm:ss``, or ``-`` when unknown."""
    return "-" if not math.isfinite(seconds) else str(timedelta(seconds=round(seconds)))
