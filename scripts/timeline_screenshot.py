"""Regenerate docs/timeline.png: the timeline page of a sample race drawn by
``effecthost inspect --group KEY --html`` and photographed in headless Chromium.

The race is the one the page tests check (tests/timeline_groups.py): a ``race`` declared
``CANCEL`` on SQLite whose caller died after rank 1, its losers cancelled by a drain.

    .venv/bin/python scripts/timeline_screenshot.py [--out docs/timeline.png]

Needs Debian's chromium and the playwright package (``./dev setup`` installs both).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from timeline_groups import RACE, race_with_cancelled_losers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "timeline.png")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("timeline_screenshot: chromium not found (./dev setup installs it)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch:
        db, page_file = Path(scratch) / "effects.sqlite3", Path(scratch) / "race.html"
        asyncio.run(race_with_cancelled_losers(db))
        command = ["inspect", "--sqlite", str(db), "--group", RACE, "--html", str(page_file)]
        subprocess.run([sys.executable, "-m", "effecthost.cli", *command], check=True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport={"width": 1140, "height": 400})
            page.goto(page_file.as_uri())
            page.screenshot(path=str(args.out), full_page=True)
            browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
