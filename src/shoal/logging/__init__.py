"""Run outputs: result writers and the console display."""

from shoal.logging.console import ProgressDisplay
from shoal.logging.writers import RunLogger, tag_for

__all__ = ["ProgressDisplay", "RunLogger", "tag_for"]
