"""report.html in a real headless browser (skipped where no Chromium is installed)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.synthetic import make_row, synthetic_rows, write_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "screenshot_report.py"

sys.path.insert(0, str(SCRIPT.parent))
try:
    from screenshot_report import find_chromium
finally:
    sys.path.pop(0)

pytest.importorskip("pandas")
pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no Chromium installed")


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    rows = synthetic_rows(tasks=("memory",), items=25)
    rows.append(make_row("memory", "item00000", "<script>alert(1)</script>", 512,
                         category="<img src=x onerror=alert(1)>", quality=1.0))
    report = build_report([write_run(tmp_path / "run", rows)], tmp_path / "out",
                          resamples=300)
    png = tmp_path / "shot.png"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(report.paths["html"]), str(png)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert png_size(png) == (1280, 2000)
    # A blank page compresses to almost nothing; tables and plots do not.
    assert png.stat().st_size > 50_000
