"""The test suite's own guard: a test that hangs fails with its stack instead of eating CI's budget."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_a_hung_test_fails_on_the_timeout_with_its_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--timeout=2", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
    )
    assert run.returncode == 1 and "Timeout" in run.stdout and "time.sleep(60)" in run.stdout, run.stdout[-2000:]
