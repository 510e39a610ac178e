"""Open every page of the built docs site in headless Chromium and save a screenshot of each, to look
at: `make docs && python .ci/docs_screenshots.py [--width 1280] [--out site-shots]`.

Chromium comes from the system (`apt-get install chromium`); the pages are opened from disk, so no
server and no network are needed. Each screenshot is the page's first `--height` pixels at
`--width`, where a table or code block wider than its column should scroll inside its box."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# no profile, no background traffic: the machine's network is closed and nothing should be fetched
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site")
    parser.add_argument("--out", type=Path, default=ROOT / "site-shots")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("pages", nargs="*", help="pages to open, relative to the site (default: all)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        print("no Chromium on PATH: install it (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (args.site / "index.html").is_file():
        print(f"no site at {args.site}: build it first (make docs)", file=sys.stderr)
        return 2
    pages = [args.site / p for p in args.pages] or sorted(
        p for p in args.site.rglob("*.html") if p.name != "404.html" and "assets" not in p.parts
    )
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        for page in pages:
            shot = args.out / (page.relative_to(args.site).with_suffix(".png").as_posix().replace("/", "-"))
            subprocess.run(
                [
                    chromium,
                    *FLAGS,
                    f"--user-data-dir={profile}",
                    f"--window-size={args.width},{args.height}",
                    f"--screenshot={shot}",
                    page.as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            print(shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
