"""Run outputs: the metric names, the log writers and the console display."""

from shoal.logging.console import ProgressDisplay, progress_mode
from shoal.logging.metrics import MetricAnalysis, log_key, log_record
from shoal.logging.writers import RunLogger

__all__ = ["MetricAnalysis", "ProgressDisplay", "RunLogger", "log_key", "log_record", "progress_mode"]
