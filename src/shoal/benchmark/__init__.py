"""``shoal benchmark``: train a set of algorithms x envs x seeds, resumably, and report them
against published returns (``runner`` runs them, ``report`` writes the table and the plot,
``references`` reads the published figures)."""

from shoal.benchmark.references import Reference, References, load_references
from shoal.benchmark.report import write_report
from shoal.benchmark.runner import RunSpec, Suite, load_suite, run_suite

__all__ = ["Reference", "References", "RunSpec", "Suite", "load_references", "load_suite", "run_suite", "write_report"]
