"""What benchmark scripts share: each measurement runs in a fresh process of its own, the script
itself called again with ``--worker KIND ARGS``, which prints one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def spawn(script: str, kind: str, src: str | None = None, **args) -> dict:
    """Run ``script --worker kind args`` and return the JSON it prints last; ``src``: import shoal
    from another checkout's ``src`` (to time a change against the code before it)."""
    env = None if src is None else {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, script, "--worker", kind, json.dumps(args)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode:
        raise RuntimeError(f"{kind} worker failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve(worker: list[str] | None, workers: dict) -> bool:
    """When the script was called as a worker (``--worker KIND ARGS``), run ``workers[KIND]`` on
    the JSON ``ARGS``, print its JSON line and return True."""
    if not worker:
        return False
    kind, payload = worker
    print(json.dumps(workers[kind](json.loads(payload))))
    return True
