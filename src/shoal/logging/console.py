"""Live console progress for long runs (rich)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressDisplay:
    """A progress bar over env steps with SPS and the mean episode return."""

    def __init__(self, title: str, total_steps: int, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(stderr=True)
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
            disable=not enabled,
        )
        self.task = self.progress.add_task(title, total=total_steps, sps=0.0, ret="-")

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def update(self, steps_done: int, result: dict[str, Any]) -> None:
        ret = result.get("episode_reward_mean", math.nan)
        self.progress.update(
            self.task, completed=steps_done, sps=result.get("sps", 0.0), ret="-" if ret != ret else f"{ret:.1f}"
        )

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()
