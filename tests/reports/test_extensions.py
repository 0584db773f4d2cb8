"""Report extensions: the generic report knows only rows; extra tables and plots come from
extensions (BudgetMem's by the ``budgetbench.reports`` entry point)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import ReportError
from pytest_budgetbench.reports import build_report, extensions
from pytest_budgetbench.reports.extensions import ENTRY_POINT_GROUP, ExtraTable
from pytest_budgetbench.reports.plots import Plot
from pytest_budgetbench.reports.render import col, integer
from pytest_budgetbench.reports.synthetic import make_row, write_run

pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[2]


class LengthReport:
    """A toy extension: answer lengths per strategy, and one marker plot per report."""

    name = "lengths"

    def __init__(self, table_name: str = "lengths") -> None:
        self.table_name = table_name
        self.plotted: list[Path] = []

    def tables(self, rows: Any) -> list[ExtraTable]:
        admitted = rows.loc[rows["status"] == "ok"]
        table = (admitted.assign(length=admitted["prediction"].str.len())
                 .groupby("strategy", as_index=False)["length"].max())
        return [ExtraTable(self.table_name, "Answer lengths", "Longest answer per strategy.",
                           table, (col("strategy", "strategy"),
                                   col("longest", "length", integer)))]

    def plots(self, summary: Any, out_dir: Path) -> list[Plot]:
        self.plotted.append(out_dir)
        return []


@pytest.fixture
def no_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "_registered", {})


def _run(tmp_path: Path) -> Path:
    rows = [make_row("memory", f"i{i}", strategy, 512, prediction="x" * (i + 1))
            for i in range(3) for strategy in ("truncation", "rag")]
    return write_run(tmp_path / "run", rows)


@pytest.mark.usefixtures("no_registered")
def test_a_registered_extension_reaches_every_output(tmp_path: Path) -> None:
    extension = LengthReport()
    extensions.register_report_extension(extension)
    report = build_report([_run(tmp_path)], tmp_path / "out", resamples=20)
    table = report.extra_tables["lengths"].table
    assert dict(zip(table["strategy"], table["length"], strict=True)) == {"rag": 3,
                                                                          "truncation": 3}
    out = tmp_path / "out"
    assert report.paths["lengths"] == out / "lengths.csv" and (out / "lengths.csv").is_file()
    document = json.loads((out / "report.json").read_text())
    assert {r["strategy"] for r in document["lengths"]} == {"rag", "truncation"}
    assert "## Answer lengths" in (out / "report.md").read_text()
    assert "Answer lengths" in (out / "report.html").read_text()
    assert extension.plotted == [out / "plots"]


@pytest.mark.usefixtures("no_registered")
def test_without_extensions_the_report_has_only_its_own_parts(tmp_path: Path) -> None:
    report = build_report([_run(tmp_path)], tmp_path / "out", plots=False, resamples=20,
                          extensions=[])
    assert report.extra_tables == {}
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "tiers" not in document and "lengths" not in document


def test_an_extension_table_may_not_shadow_the_report(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="table named 'summary'"):
        build_report([_run(tmp_path)], tmp_path / "out", plots=False, resamples=20,
                     extensions=[LengthReport("summary")])
    with pytest.raises(ReportError, match="table named 'lengths', which another extension"):
        build_report([_run(tmp_path)], tmp_path / "out", plots=False, resamples=20,
                     extensions=[LengthReport(), LengthReport()])


def test_budgetmem_declares_its_extension_by_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    target = project["project"]["entry-points"][ENTRY_POINT_GROUP]["budgetmem"]
    assert target == "pytest_budgetbench.strategies.budgetmem.report:EXTENSION"
    module, _, attr = target.partition(":")
    extension = getattr(importlib.import_module(module), attr)
    assert extension.name == "budgetmem"
    assert [t.name for t in extension.tables(pd.DataFrame(columns=["task"]))] == ["tiers"]


def test_the_generic_report_does_not_import_budgetmem() -> None:
    code = ("import sys\n"
            "import pytest_budgetbench.reports.builder, pytest_budgetbench.reports.extensions\n"
            "print(sorted(m for m in sys.modules if 'budgetmem' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
