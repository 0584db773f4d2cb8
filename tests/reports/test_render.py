"""The written files: report.json schema, escaping in report.html and report.md, plots."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.reports import build_report
from pytest_budgetbench.reports.report_json import SCHEMA, SCHEMA_VERSION, cell_records
from pytest_budgetbench.reports.synthetic import make_row, synthetic_rows, write_run
from pytest_budgetbench.reports.viewer_page import script_csp_source, script_text

pytest.importorskip("pandas")

EVIL_STRATEGY = "<script>alert(1)</script>"
EVIL_CATEGORY = "<img src=x onerror=alert(2)>"
EVIL_TASK = '../../"evil" & <task>'
EVIL_ERROR = "boom </td></tr></table><script>alert(3)</script>"


def evil_rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(6):
        rows.append(make_row(EVIL_TASK, f"i{i}", "full_context", 4000, reference=True,
                             category=EVIL_CATEGORY, quality=1.0))
        rows.append(make_row(EVIL_TASK, f"i{i}", EVIL_STRATEGY, 500, category=EVIL_CATEGORY,
                             quality=float(i % 2), model="<b>model</b>",
                             prediction="<iframe src=//evil.example>"))
    rows.append(make_row(EVIL_TASK, "i9", EVIL_STRATEGY, 500, status="error", error=EVIL_ERROR))
    return rows


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("evil")
    run = write_run(tmp / "run", evil_rows())
    return build_report([run], tmp / "out", resamples=500)


def test_html_escapes_every_data_string(evil_report: Any) -> None:
    page = evil_report.paths["html"].read_text(encoding="utf-8")
    for raw in (EVIL_STRATEGY, EVIL_CATEGORY, "<b>model</b>", EVIL_ERROR, "<task>",
                "<iframe"):
        assert raw not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page
    # The only tags are the report's own, and the only scripts the viewer's data block
    # (JSON, never run) and its own script (whose text is left out of the scan).
    markup = page.replace(script_text(), "")
    assert page.count(script_text()) == 1
    assert markup.count("<script") == 2
    assert '<script type="application/json" id="bb-data">' in markup
    tags = set(re.findall(r"<\s*([a-zA-Z][a-zA-Z0-9]*)", markup))
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "dl", "dt",
               "dd", "p", "div", "table", "thead", "tbody", "tr", "th", "td", "figure", "img",
               "figcaption", "a", "details", "summary", "section", "noscript", "script"}
    assert tags <= allowed, tags - allowed


def test_html_is_self_contained(evil_report: Any) -> None:
    page = evil_report.paths["html"].read_text(encoding="utf-8")
    sources = re.findall(r"""\bsrc\s*=\s*"([^"]*)\"""", page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert len(sources) == len(evil_report.plots) == 3
    links = re.findall(r"""\bhref\s*=\s*"([^"]*)\"""", page)
    assert links and all(link.startswith("#") for link in links)  # the viewer's anchors
    # No network, and no script but the viewer's, allowed by its hash alone.
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert f"script-src {script_csp_source(script_text())}\"" in page
    assert "unsafe-inline'" not in page.split("script-src", 1)[1].split('"', 1)[0]


def test_plot_files_stay_inside_the_output_directory(evil_report: Any) -> None:
    plots_dir = (evil_report.out_dir / "plots").resolve()
    for plot in evil_report.plots:
        assert plot.path.resolve().parent == plots_dir
        assert plot.path.stat().st_size > 1000


def test_markdown_escapes_data_strings(evil_report: Any) -> None:
    text = evil_report.paths["md"].read_text(encoding="utf-8")
    assert EVIL_STRATEGY not in text and EVIL_CATEGORY not in text
    assert "&lt;script&gt;" in text
    table_lines = [line for line in text.splitlines() if line.startswith("| ")]
    widths = {line.replace("\\|", "").count("|") for line in table_lines if "strategy" in line}
    assert widths  # headers present, cells did not add columns
    assert "](plots/" in text


def test_report_json_schema_and_items(evil_report: Any) -> None:
    document = json.loads(evil_report.paths["json"].read_text(encoding="utf-8"))
    assert (document["schema"], document["schema_version"]) == (SCHEMA, SCHEMA_VERSION)
    assert {"summary", "paired", "categories", "items", "settings", "plots"} <= set(document)
    assert document["settings"]["resamples"] == 500
    cells = cell_records(document)
    evil = cells[(EVIL_TASK, EVIL_STRATEGY, 500)]
    assert evil.quality == {f"i{i}": float(i % 2) for i in range(6)}
    assert (evil.n_ok, evil.n_violation) == (6, 0)
    assert cells[(EVIL_TASK, "full_context", 4000)].reference


def test_report_json_is_strict_json(tmp_path: Path) -> None:
    # NaN statistics (no admitted items) must be null, not the non-standard NaN token.
    run = write_run(tmp_path / "run", [make_row(status="violation")])
    report = build_report([run], tmp_path / "out", plots=False)
    text = report.paths["json"].read_text(encoding="utf-8")
    assert "NaN" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard {name}"))


def test_full_synthetic_report_has_every_file(tmp_path: Path) -> None:
    rows = synthetic_rows(tasks=("memory", "qa"), strategies=("full_context", "truncation", "rag"),
                          budgets=(256, 1024), items=30, repeats=2)
    report = build_report([write_run(tmp_path / "run", rows)], tmp_path / "out", resamples=300)
    for name in ("summary.csv", "paired.csv", "categories.csv", "report.json", "report.md",
                 "report.html"):
        assert (tmp_path / "out" / name).is_file()
    assert {p.kind for p in report.plots} == {"quality_tokens", "quality_latency", "violations"}
    assert len(report.plots) == 6
    assert len(report.summary) == 2 * 3 * 2


def test_importing_reports_stays_light() -> None:
    code = ("import sys, pytest_budgetbench.reports as r; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
