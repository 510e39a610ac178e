"""Build shoal's sdist and wheel, install the wheel (not editable) into a fresh venv, and use it.

What an editable install in the source tree cannot show: that the sdist holds what a wheel is
built from (the wheel is built from the sdist, as pip would), that the wheel carries every module
and `py.typed`, that its metadata resolves against the pinned torch, and that `shoal` runs from a
directory where `src/` is not on the path. Every optional extra the wheel declares is resolved
(not installed) against the constraints file, so a pin that conflicts with it fails here rather
than for a user.

Run as `make wheel-check`; exits non-zero with the failing command's output.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"


def run(*cmd: str | Path, cwd: Path = ROOT) -> str:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"wheel check failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def torch_pin() -> str:
    pins = [line for line in CONSTRAINTS.read_text().splitlines() if line.startswith("torch==")]
    if not pins:
        sys.exit(f"{CONSTRAINTS} pins no torch version")
    return pins[0]


def check_contents(wheel: Path) -> list[str]:
    """Every module of src/shoal and the py.typed marker are in the wheel; returns its extras."""
    package = ROOT / "src"
    wanted = {p.relative_to(package).as_posix() for p in (package / "shoal").rglob("*.py")}
    wanted.add("shoal/py.typed")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    missing = wanted - set(names)
    if missing:
        sys.exit(f"{wheel.name} lacks {sorted(missing)}")
    return re.findall(r"^Provides-Extra: (\S+)$", metadata, re.MULTILINE)


def main() -> None:
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/shoal/__init__.py").read_text())
    if version is None:
        sys.exit("src/shoal/__init__.py defines no __version__")
    with tempfile.TemporaryDirectory(prefix="shoal-wheel-") as tmp_name:
        tmp = Path(tmp_name)
        dist = tmp / "dist"
        run(sys.executable, "-m", "build", "--outdir", dist, ROOT)  # the sdist, then the wheel from it
        wheel = next(dist.glob("shoal-*.whl"))
        sdist = next(dist.glob("shoal-*.tar.gz"))
        extras = check_contents(wheel)
        print(f"built {sdist.name} and from it {wheel.name} ({wheel.stat().st_size // 1024} KiB), all modules in it")

        venv = tmp / "venv"
        run(sys.executable, "-m", "venv", venv)
        pip, shoal = venv / "bin/pip", venv / "bin/shoal"
        run(pip, "install", "-q", torch_pin())
        run(pip, "install", "-q", "-c", CONSTRAINTS, wheel)

        # Outside the tree: a run directory of its own, and nothing from src/ importable.
        outside = tmp / "elsewhere"
        outside.mkdir()
        printed = run(shoal, "--version", cwd=outside).strip()
        if printed != f"shoal {version[1]}":
            sys.exit(f"`shoal --version` printed {printed!r}, expected 'shoal {version[1]}'")
        where = run(venv / "bin/python", "-c", "import shoal; print(shoal.__file__)", cwd=outside).strip()
        if not where.startswith(str(venv)):
            sys.exit(f"shoal was imported from {where}, not from the installed wheel in {venv}")
        run(shoal, "train", "CartPole-v1", "total_timesteps=2000", "verbose=0", cwd=outside)
        if not list((outside / "runs").glob("*/checkpoints/*")):
            sys.exit(f"the training run left no checkpoint under {outside / 'runs'}")
        tuned = "from shoal.config.tuned import tuned_path; print(tuned_path('dqn', 'LunarLander-v3'))"
        if not run(venv / "bin/python", "-c", tuned, cwd=outside).strip().startswith(str(venv)):
            sys.exit("the wheel lacks the tuned configs (package data shoal/tuned/*/*.yaml)")

        for extra in extras:
            run(pip, "install", "-q", "--dry-run", "-c", CONSTRAINTS, f"{wheel}[{extra}]")
        print(f"wheel check passed: {printed}, trained from {outside}, extras resolve: {', '.join(extras)}")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' scratch directory, if any
