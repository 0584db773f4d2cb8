"""Render a report.html in headless Chromium and save a PNG screenshot.

    python scripts/screenshot_report.py REPORT_HTML SCREENSHOT_PNG [--chromium PATH]

Exit status: 0 with the PNG written, 1 if Chromium failed, 3 if no Chromium was found.
Chromium runs with a throwaway profile and every background network feature off, so the
screenshot also shows that the report renders offline.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
EXIT_NO_BROWSER = 3


def find_chromium(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if Path(explicit).exists() or shutil.which(explicit) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(
    browser: str, html: Path, png: Path, *, size: str = "1280,2000", timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="budgetbench-chromium-") as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={png.resolve()}",
            f"--window-size={size}",
            html.resolve().as_uri(),
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--chromium", help="path of the browser (default: search PATH)")
    parser.add_argument("--window-size", default="1280,2000")
    args = parser.parse_args(argv)
    browser = find_chromium(args.chromium)
    if browser is None:
        print("screenshot_report: no Chromium found", file=sys.stderr)
        return EXIT_NO_BROWSER
    result = screenshot(browser, args.html, args.png, size=args.window_size)
    if result.returncode != 0 or not args.png.is_file() or args.png.stat().st_size == 0:
        print(result.stdout + result.stderr, file=sys.stderr)
        return 1
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
