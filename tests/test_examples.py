"""Every script under examples/ runs to its end at a tiny budget, as a user would start it.

Each takes its step budget as its first argument; a new example without one would train for its
full default budget here, so the test also checks each one names `sys.argv[1]`.
"""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))
pytestmark = pytest.mark.slow


def test_examples_are_found():
    assert {p.name for p in EXAMPLES} >= {"reinforce.py", "custom_model.py", "callbacks.py", "self_play.py"}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_at_a_tiny_budget(script, tmp_path):
    assert "sys.argv[1]" in script.read_text(), f"{script.name} must take its step budget as its first argument"
    done = subprocess.run(
        [sys.executable, str(script), "1024"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{script.name} printed no result"
